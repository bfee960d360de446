#include "ingot/train/train_step.h"

#include <cstring>

#include "ingot/core/error.h"
#include "ingot/ops/ops.h"
#include "ingot/ops/profile.h"
#ifdef INGOT_HAVE_CUDA
#include "ingot/ops/cuda/device.h"
#endif

namespace ingot {

TrainStep::TrainStep(Context& ctx, Transformer& model, AdamW& optimizer, int64_t accum, bool packed,
                     bool use_graph)
    : ctx_(ctx), model_(model), optimizer_(optimizer), accum_(accum),
      rows_(model.micro_batch() * model.seq_len()), use_graph_(use_graph && ctx.device == Device::cuda),
      inputs_up_(ctx, accum * 4 * rows_ * int64_t(sizeof(int32_t))),
      results_down_(ctx, 2 * int64_t(sizeof(double))) {
  INGOT_CHECK(accum >= 1, "gradient_accumulation_steps must be >= 1 (got ", accum, ")");
  model_.reserve_staging(accum, packed);
  result_arena_ = std::make_unique<Arena>("step results", ctx.device);
  result_arena_->reserve(Arena::kAlignment);
  results_ = result_arena_->allocate(DType::f64, {2});
  ops::zero(ctx, results_);
}

TrainStep::~TrainStep() {
#ifdef INGOT_HAVE_CUDA
  if (ctx_.device == Device::cuda) {
    try {
      cuda::synchronize(ctx_.cuda);
    } catch (...) {
    }
  }
#endif
}

data::BatchBuffers TrainStep::host_batch(int64_t micro) {
  INGOT_CHECK(micro >= 0 && micro < accum_, "host_batch: micro-batch ", micro, " of ", accum_);
  const int slot = static_cast<int>(launches_ % inputs_up_.slots());
  if (!host_slot_open_) {
    inputs_up_.wait(slot);  // the upload that last used this slot, two launches ago
    host_slot_open_ = true;
  }
  int32_t* base = static_cast<int32_t*>(inputs_up_.slot(slot)) + micro * 4 * rows_;
  data::BatchBuffers b;
  b.input_ids = base;
  b.targets = base + rows_;
  b.positions = base + 2 * rows_;
  b.segment_ids = base + 3 * rows_;
  return b;
}

// Everything one step does on the device; captured into the graph as is.
void TrainStep::body() {
  const Tensor loss_sum = results_.slice_rows(0, 1);
  for (int64_t micro = 0; micro < accum_; ++micro) {
    model_.use_staged(micro);
    // The first micro-batch overwrites the gradients: no zeroing pass over the whole buffer.
    model_.forward_backward_into(1.0, loss_sum, micro > 0,
                                 micro == 0 ? Transformer::GradWrite::overwrite : Transformer::GradWrite::accumulate);
  }
  optimizer_.update(model_.weights(), model_.grads());
  ops::copy(ctx_, results_.slice_rows(1, 2), optimizer_.grad_norm());
}

void TrainStep::launch(int64_t step, int64_t update, double lr, int64_t target_count, bool eager) {
  INGOT_CHECK(host_slot_open_, "TrainStep::launch: no batch was written since the last launch");
  INGOT_CHECK(pending_.size() < 2, "TrainStep: two steps are in flight already; collect() first");
  host_slot_open_ = false;
  const int slot = static_cast<int>(launches_ % 2);
  inputs_up_.upload(slot, model_.staged_inputs());
  optimizer_.set_step(lr, update, static_cast<double>(std::max<int64_t>(target_count, 1)));

  // A generation forward of a shorter input rebinds the activations: restore the step's shapes.
  model_.bind_full_batch();
  [[maybe_unused]] const bool graph = use_graph_ && !eager && !ops::profiling_enabled();
#ifdef INGOT_HAVE_CUDA
  // The graph holds buffer addresses: capture again if activations or scratch moved since.
  if (graph && graph_ready_ && (graph_layout_ != model_.layout_version() ||
                                graph_scratch_ != cuda::scratch_generation(ctx_.cuda)))
    graph_ready_ = false;
  if (graph && !graph_ready_ && launches_ > 0) {
    // An earlier launch ran eagerly, so every plan and scratch buffer exists: capture now.
    cuda::begin_capture(ctx_.cuda);
    try {
      body();
    } catch (...) {
      cuda::abort_capture(ctx_.cuda);
      throw;
    }
    cuda::end_capture_and_instantiate(ctx_.cuda);
    graph_ready_ = true;
    graph_layout_ = model_.layout_version();
    graph_scratch_ = cuda::scratch_generation(ctx_.cuda);
  }
  if (graph && graph_ready_) cuda::replay(ctx_.cuda);
  else body();
#else
  body();
#endif
  // Results slot: with at most two steps in flight, this slot's previous read-back was collected.
  results_down_.download(slot, results_);
  pending_.emplace_back(step, slot);
  ++launches_;
}

StepResult TrainStep::collect() {
  INGOT_CHECK(!pending_.empty(), "TrainStep::collect: no step in flight");
  const auto [step, slot] = pending_.front();
  pending_.pop_front();
  results_down_.wait(slot);
  double values[2];
  std::memcpy(values, results_down_.slot(slot), sizeof values);
  StepResult r;
  r.step = step;
  r.loss_sum = values[0];
  r.grad_norm = values[1];
  return r;
}

}  // namespace ingot
