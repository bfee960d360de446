#include "ingot/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace ingot {

// set_step uploads the input slots only, which must therefore come first.
static_assert(ops::kAdamWStepSize < ops::kAdamWSumSquares && ops::kAdamWBiasCorrection2 < ops::kAdamWSumSquares &&
              ops::kAdamWDecay < ops::kAdamWSumSquares && ops::kAdamWGradDivisor < ops::kAdamWSumSquares &&
              ops::kAdamWMaxGradNorm < ops::kAdamWSumSquares && ops::kAdamWUpdate < ops::kAdamWSumSquares &&
              ops::kAdamWSumSquares < ops::kAdamWGradNorm);

int64_t AdamW::estimate_state_bytes(int64_t numel, const Recipe& recipe) {
  return 2 * numel * dtype_size(recipe.optimizer_state);
}
int64_t AdamW::estimate_master_bytes(int64_t numel, const Recipe& recipe) {
  return recipe.master_weights ? numel * 4 : 0;
}

std::vector<std::string> AdamW::bf16_rounding_warnings(const Recipe& recipe, double beta1, double beta2,
                                                        double learning_rate) {
  std::vector<std::string> warnings;
  if (recipe.stochastic_rounding) {
    if (!rounds_stochastically(recipe))
      warnings.push_back("stochastic_rounding: true has no effect with master_weights: true and optimizer_state_dtype "
                         "f32: no store of the update is in bf16");
    return warnings;
  }
  if (recipe.optimizer_state == DType::bf16) {
    for (const auto& [key, beta] : {std::pair{"adam_beta1", beta1}, std::pair{"adam_beta2", beta2}}) {
      if (1.0 - beta >= 1.0 / 256) continue;
      std::ostringstream message;
      message << "optimizer_state_dtype bf16 with " << key << " " << beta << ": 1 - " << key
              << " is below half a bf16 step, so that moment cannot decay once gradients shrink; use " << key
              << " <= 0.996, optimizer_state_dtype f32 or stochastic_rounding: true";
      warnings.push_back(message.str());
    }
  }
  if (recipe.param == DType::bf16 && !recipe.master_weights && learning_rate > 0) {
    // Half a bf16 step is 2^(e-8) on [2^e, 2^(e+1)): above 2^(floor(log2 lr) + 9) it exceeds lr.
    const double above = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(learning_rate))) + 9);
    std::ostringstream message;
    message << "master_weights: false rounds every update into the bf16 weights: at learning_rate " << learning_rate
            << " an update of that size is lost on every weight above " << above
            << " in magnitude (half a bf16 step there is larger), and AdamW's updates are mostly smaller; set "
               "stochastic_rounding: true to keep them (docs/config.md)";
    warnings.push_back(message.str());
  }
  return warnings;
}

AdamW::AdamW(const std::vector<ParamEntry>& entries, const Recipe& recipe, Context& ctx,
             const AdamWConfig& config, Tensor weights)
    : entries_(entries), recipe_(recipe), ctx_(ctx), config_(config),
      scalar_upload_(ctx, ops::kAdamWSlots * int64_t(sizeof(double))) {
  const int64_t P = weights.numel();
  state_arena_ = std::make_unique<Arena>("optimizer state", ctx.device);
  master_arena_ = std::make_unique<Arena>("master weights", ctx.device);
  scalar_arena_ = std::make_unique<Arena>("optimizer scalars", ctx.device);
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
  // Decayed parameters as merged element ranges. Padding between parameters is zero in every
  // buffer and stays zero under the update, so a range may run across it.
  std::vector<int64_t> runs;
  for (const ParamEntry& e : entries_) {
    if (!decays(e) || e.numel == 0) continue;
    if (!runs.empty() && runs.back() <= e.offset && e.offset - runs.back() < 64) runs.back() = e.offset + e.numel;
    else runs.insert(runs.end(), {e.offset, e.offset + e.numel});
  }
  const int64_t R = static_cast<int64_t>(runs.size() / 2);
  scalar_arena_->reserve(2 * Arena::kAlignment + (2 * std::max<int64_t>(R, 1) + ops::kAdamWSlots) * 8);
  decay_runs_ = scalar_arena_->allocate(DType::i64, {R, 2});
  scalars_ = scalar_arena_->allocate(DType::f64, {ops::kAdamWSlots});
  if (R > 0) copy_from_host(ctx, decay_runs_, runs.data());
  ops::zero(ctx, scalars_);
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

void AdamW::set_step(double lr, int64_t step, double grad_divisor) {
  INGOT_CHECK(step >= 1, "AdamW: step ", step, " must be >= 1 (it is 1-based)");
  INGOT_CHECK(grad_divisor > 0, "AdamW: gradient divisor ", grad_divisor, " must be positive");
  const double t = static_cast<double>(step);
  // Two slots in turn: the host rewrites one only after the copy that last read it has run.
  const int slot = static_cast<int>(uploads_++ % scalar_upload_.slots());
  scalar_upload_.wait(slot);
  double* s = static_cast<double*>(scalar_upload_.slot(slot));
  std::fill(s, s + ops::kAdamWSlots, 0.0);
  // Formed in double and rounded once on the device, as torch does with Python-float hyperparameters.
  s[ops::kAdamWStepSize] = lr / (1.0 - std::pow(config_.beta1, t));
  s[ops::kAdamWBiasCorrection2] = std::sqrt(1.0 - std::pow(config_.beta2, t));
  s[ops::kAdamWDecay] = 1.0 - lr * config_.weight_decay;
  s[ops::kAdamWGradDivisor] = grad_divisor;
  s[ops::kAdamWMaxGradNorm] = config_.max_grad_norm;
  s[ops::kAdamWUpdate] = t;
  // Only the inputs: the slots the op writes (sum of squares, grad norm) keep the last update's values.
  scalar_upload_.upload(slot, scalars_.slice_rows(0, ops::kAdamWSumSquares));
}

void AdamW::update(Tensor weights, Tensor grads) {
  ops::AdamWConstants constants;
  constants.beta1 = config_.beta1;
  constants.beta2 = config_.beta2;
  constants.eps = config_.eps;
  constants.stochastic_rounding = rounds_stochastically(recipe_);
  constants.rounding_seed = config_.rounding_seed;
  ops::adamw_step(ctx_, weights, grads, m_, v_, master_, decay_runs_, scalars_, constants);
}

double AdamW::step(Tensor weights, Tensor grads, double lr, int64_t step, double grad_divisor) {
  set_step(lr, step, grad_divisor);
  update(weights, grads);
  return to_host_doubles(ctx_, grad_norm())[0];
}

}  // namespace ingot
