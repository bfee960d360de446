// AdamW over the model's flat parameter buffer, with global-norm gradient clipping folded into the
// update (ops::adamw_step: a fixed handful of launches, whatever the parameter count). Weight
// decay is decoupled and, by default, applies to matrices only: not to norms, biases or embeddings.
// Per-step values (learning rate, step, gradient divisor) live in a small device tensor written
// before each step, so the update can be replayed from a captured CUDA graph.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "ingot/core/arena.h"
#include "ingot/core/staging.h"
#include "ingot/model/parameters.h"
#include "ingot/ops/ops.h"
#include "ingot/recipe/recipe.h"

namespace ingot {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 1.0;          // <= 0 disables clipping
  bool decay_norms = false, decay_biases = false, decay_embeddings = false;
  uint64_t rounding_seed = 0;          // the recipe's stochastic rounding draws from this seed
};

class AdamW {
 public:
  AdamW(const std::vector<ParamEntry>& entries, const Recipe& recipe, Context& ctx, const AdamWConfig& config,
        Tensor weights);

  // Sets the scalars of the next update(): learning rate lr, `step` counting updates from 1, and
  // grad_divisor, the number of loss terms the gradient buffer sums over (the update divides by
  // it). An asynchronous upload from pinned memory: no host wait in the steady state.
  void set_step(double lr, int64_t step, double grad_divisor);
  // Enqueues clipping + AdamW over the whole flat buffer with the scalars set last (capturable).
  void update(Tensor weights, Tensor grads);
  // (1) f64 on the device: the global norm of the mean-loss gradient, before clipping, as
  // computed by the last update().
  Tensor grad_norm() const { return scalars_.slice_rows(ops::kAdamWGradNorm, ops::kAdamWGradNorm + 1); }
  // set_step + update + read the norm back (synchronising): tests and one-off callers.
  double step(Tensor weights, Tensor grads, double lr, int64_t step, double grad_divisor = 1.0);

  Tensor exp_avg() const { return m_; }      // flat (P)
  Tensor exp_avg_sq() const { return v_; }   // flat (P)
  Tensor master() const { return master_; }  // flat (P) f32, absent without master weights
  int64_t state_bytes() const { return state_arena_->capacity(); }
  int64_t master_bytes() const { return master_arena_->capacity(); }
  static int64_t estimate_state_bytes(int64_t numel, const Recipe& recipe);
  static int64_t estimate_master_bytes(int64_t numel, const Recipe& recipe);
  // What rounding the optimizer's bf16 stores to nearest loses, for the trainer to warn about; none
  // with the recipe's stochastic rounding, which keeps such changes in expectation (instead, one
  // message if that option has nothing to round).
  //  - Moments stored in bf16: one whose decay per step (1 - beta) is below half a bf16 step (at
  //    most 2^-8 of its value) cannot shrink, so v stops decaying once gradients get smaller
  //    (torch with bf16 parameters does the same). One message per config key (adam_beta1,
  //    adam_beta2) for which that holds.
  //  - Weights without a master copy: an update of the learning rate's size is lost on every weight
  //    above 2^(floor(log2 lr) + 9) in magnitude, where half a bf16 step is larger. One message.
  static std::vector<std::string> bf16_rounding_warnings(const Recipe& recipe, double beta1, double beta2,
                                                         double learning_rate);

  bool decays(const ParamEntry& e) const;

 private:
  std::vector<ParamEntry> entries_;
  Recipe recipe_;
  Context& ctx_;
  AdamWConfig config_;
  std::unique_ptr<Arena> state_arena_, master_arena_, scalar_arena_;
  Tensor m_, v_, master_;
  Tensor decay_runs_;   // (R,2) i64: element ranges that take weight decay
  Tensor scalars_;      // (ops::kAdamWSlots) f64
  HostRing scalar_upload_;
  int64_t uploads_ = 0;
};

}  // namespace ingot
