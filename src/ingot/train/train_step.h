// One optimizer step as a unit that the trainer and `ingot bench` share: upload the step's
// micro-batches, forward + backward per micro-batch (the first overwrites the gradients, the
// others add to them), clip + AdamW, and copy the loss sum and grad norm back. On CUDA the whole
// step is captured once as a CUDA graph (on the second launch; the first runs eagerly and creates
// every plan and scratch buffer) and then replayed, and nothing waits on the GPU in the steady
// state: inputs go up from pinned memory, results come back through pinned memory and are
// collected one step later.
// Invariants:
//   - The gradient buffer holds the gradient of the loss SUM; the optimizer divides by the
//     number of targets (its grad_divisor), so one captured graph serves any target count.
//   - At most two steps are in flight; collect() returns results in launch order.
//   - The graph holds buffer addresses: it is captured again when the activations were re-planned
//     (a shorter generation input in between) or the CUDA scratch buffer grew since.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>

#include "ingot/core/arena.h"
#include "ingot/core/staging.h"
#include "ingot/data/loader.h"
#include "ingot/model/transformer.h"
#include "ingot/optim/adamw.h"

namespace ingot {

struct StepResult {
  int64_t step = 0;       // 1-based training step
  double loss_sum = 0;    // sum of per-target losses over the step's micro-batches
  double grad_norm = 0;   // global norm of the mean-loss gradient, before clipping
};

class TrainStep {
 public:
  // accum micro-batches per step; packed: the batches carry segment ids (document masking);
  // use_graph: capture and replay on CUDA (ignored on the CPU).
  TrainStep(Context& ctx, Transformer& model, AdamW& optimizer, int64_t accum, bool packed, bool use_graph);
  ~TrainStep();

  // Host buffers for micro-batch `micro` of the next launch, (B, T) each.
  data::BatchBuffers host_batch(int64_t micro);
  // Enqueues one optimizer step on the batches written since the last launch. step: the 1-based
  // training step it reports as; update: the 1-based count of updates made with it (AdamW's t, which
  // runs behind step when steps without targets made none). target_count: how many targets are not
  // ignored (the loss is their mean). eager: never capture or replay (the profiler times ops one by one).
  void launch(int64_t step, int64_t update, double lr, int64_t target_count, bool eager = false);
  // Waits for the oldest step not yet collected and returns its results.
  StepResult collect();
  int64_t in_flight() const { return static_cast<int64_t>(pending_.size()); }
  bool graph_captured() const { return graph_ready_; }

 private:
  void body();

  Context& ctx_;
  Transformer& model_;
  AdamW& optimizer_;
  int64_t accum_, rows_;
  bool use_graph_;
  bool graph_ready_ = false;
  int64_t launches_ = 0, graph_layout_ = -1, graph_scratch_ = -1;
  bool host_slot_open_ = false;
  std::unique_ptr<Arena> result_arena_;
  Tensor results_;                 // (2) f64 on the device: loss sum, grad norm
  HostRing inputs_up_, results_down_;
  std::deque<std::pair<int64_t, int>> pending_;  // (step, results slot) in launch order
};

}  // namespace ingot
