// AdamW over the model's flat parameter buffer, with global-norm gradient clipping folded into the
// update (one scale factor, no extra pass over the gradients). Weight decay is decoupled and, by
// default, applies to matrices only: not to norms, biases or embeddings.
#pragma once
#include <memory>
#include <vector>

#include "ingot/core/arena.h"
#include "ingot/model/parameters.h"
#include "ingot/ops/ops.h"
#include "ingot/recipe/recipe.h"

namespace ingot {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 1.0;          // <= 0 disables clipping
  bool decay_norms = false, decay_biases = false, decay_embeddings = false;
};

class AdamW {
 public:
  AdamW(const std::vector<ParamEntry>& entries, const Recipe& recipe, Context& ctx, const AdamWConfig& config,
        Tensor weights);
  // One update with learning rate lr; `step` counts updates from 1. Returns the global grad norm
  // (before clipping).
  double step(Tensor weights, Tensor grads, double lr, int64_t step);

  Tensor exp_avg() const { return m_; }      // flat (P)
  Tensor exp_avg_sq() const { return v_; }   // flat (P)
  Tensor master() const { return master_; }  // flat (P) f32, absent without master weights
  int64_t state_bytes() const { return state_arena_->capacity(); }
  int64_t master_bytes() const { return master_arena_->capacity(); }
  static int64_t estimate_state_bytes(int64_t numel, const Recipe& recipe);
  static int64_t estimate_master_bytes(int64_t numel, const Recipe& recipe);

  bool decays(const ParamEntry& e) const;

 private:
  std::vector<ParamEntry> entries_;
  Recipe recipe_;
  Context& ctx_;
  AdamWConfig config_;
  std::unique_ptr<Arena> state_arena_, master_arena_;
  Tensor m_, v_, master_;
};

}  // namespace ingot
