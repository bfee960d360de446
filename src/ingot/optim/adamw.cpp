#include "ingot/optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace ingot {

int64_t AdamW::estimate_state_bytes(int64_t numel, const Recipe& recipe) {
  return 2 * numel * dtype_size(recipe.optimizer_state);
}
int64_t AdamW::estimate_master_bytes(int64_t numel, const Recipe& recipe) {
  return recipe.master_weights ? numel * 4 : 0;
}

AdamW::AdamW(const std::vector<ParamEntry>& entries, const Recipe& recipe, Context& ctx,
             const AdamWConfig& config, Tensor weights)
    : entries_(entries), recipe_(recipe), ctx_(ctx), config_(config) {
  const int64_t P = weights.numel();
  state_arena_ = std::make_unique<Arena>("optimizer state", ctx.device);
  master_arena_ = std::make_unique<Arena>("master weights", ctx.device);
  state_arena_->reserve(estimate_state_bytes(P, recipe) + 2 * Arena::kAlignment);
  m_ = state_arena_->allocate(recipe.optimizer_state, {P});
  v_ = state_arena_->allocate(recipe.optimizer_state, {P});
  ops::zero(ctx, m_);
  ops::zero(ctx, v_);
  if (recipe.master_weights) {
    master_arena_->reserve(estimate_master_bytes(P, recipe) + Arena::kAlignment);
    master_ = master_arena_->allocate(DType::f32, {P});
    ops::copy(ctx, master_, weights);
  }
}

bool AdamW::decays(const ParamEntry& e) const {
  switch (e.kind) {
    case ParamKind::matrix: return true;
    case ParamKind::norm: return config_.decay_norms;
    case ParamKind::bias: return config_.decay_biases;
    case ParamKind::embedding: return config_.decay_embeddings;
  }
  return true;
}

double AdamW::step(Tensor weights, Tensor grads, double lr, int64_t step) {
  // Padding between parameters in the flat buffer stays zero, so one pass gives the global norm.
  const double norm = std::sqrt(ops::sum_squares(ctx_, grads));
  double clip = 1.0;
  // torch.nn.utils.clip_grad_norm_: coefficient max/(norm+1e-6), clamped to 1.
  if (config_.max_grad_norm > 0) clip = std::min(1.0, config_.max_grad_norm / (norm + 1e-6));
  ops::AdamWHyper hyper;
  hyper.lr = lr;
  hyper.beta1 = config_.beta1;
  hyper.beta2 = config_.beta2;
  hyper.eps = config_.eps;
  hyper.step = step;
  hyper.grad_scale = clip;
  for (const ParamEntry& e : entries_) {
    hyper.weight_decay = decays(e) ? config_.weight_decay : 0.0;
    const Tensor master = master_.present() ? param_view(master_, e) : Tensor();
    ops::adamw_update(ctx_, param_view(weights, e), param_view(grads, e), param_view(m_, e), param_view(v_, e),
                      master, hyper);
  }
  return norm;
}

}  // namespace ingot
