// The memory a training run needs, per arena category, computed before anything is allocated
// (the trainer prints it and refuses a run that does not fit; `ingot info` prints it too).
#pragma once
#include <cstdint>
#include <string>

#include "ingot/core/context.h"
#include "ingot/model/config.h"
#include "ingot/model/transformer.h"
#include "ingot/recipe/recipe.h"

namespace ingot {

struct TrainingMemory {
  int64_t params = 0, grads = 0, master = 0, optimizer = 0, activations = 0, scratch = 0;
  int64_t attention_workspace = 0;  // cuDNN's attention backward workspace, counted in scratch
  // The attention the workspace serves (CUDA only): rows, length, heads, head size, activation dtype.
  struct Attention {
    int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
    bool packed_rows = false;
    bool bf16 = true;
  } attention;
  int64_t total() const { return params + grads + master + optimizer + activations + scratch; }
  // "params X | grads X | master X | optimizer X | activations X | scratch X | total X"
  std::string summary() const;
};

// CUDA: fails, naming the config key, for a model whose head_dim or hidden_size Ingot's CUDA
// kernels do not take; `instead` ends the message (what to do: "train it with device: cpu").
// Called by estimate_training_memory for CUDA, and by generate before it loads the weights.
void check_cuda_model_shapes(const ModelConfig& config, const std::string& instead);

// packed_rows: the batches carry segment ids (documents packed into rows), whose attention takes
// other CUDA paths with other scratch needs than whole rows.
TrainingMemory estimate_training_memory(const ModelConfig& config, const Recipe& recipe, Device device,
                                        int64_t micro_batch, int64_t seq_len, int64_t logits_chunk_tokens = 0,
                                        Recompute recompute = Recompute::none, bool packed_rows = false);

// CUDA: when the plan exceeds the device's free memory and cuDNN's attention backward workspace
// is part of it, shrinks that workspace to the largest slice of the backward that fits (cuDNN then
// runs the backward in several calls, cudnn_backward_split in attention_cudnn.h), or, where not even
// the smallest slice fits, drops it and has the backward run on the tensor-core kernels
// (slower, no workspace). Otherwise lets cuDNN take the backward in one call. Returns a note for the
// log when it shrank or dropped the workspace and the run then fits, else "". Call before
// check_memory_fits.
std::string fit_attention_workspace(TrainingMemory& memory, const Context& ctx);

// What cuDNN's attention-backward workspace adds to the plan's scratch (CUDA): in one call (the
// plan as estimated) and at the smallest slice fit_attention_workspace can shrink it to (one row's
// one kv-head group). Both 0 where the plan has no such workspace (CPU, packed rows, no cuDNN).
struct AttentionWorkspaceRange {
  int64_t one_call = 0, smallest_slice = 0;
};
AttentionWorkspaceRange attention_workspace_range(const TrainingMemory& memory);

// Fails, before anything is allocated, when the plan exceeds the free memory of ctx's device (GPU
// memory, or physical RAM for the CPU). The message gives both sizes, the device and `hint` (what
// shrinks the run), or `state_hint` where the weights, gradients and optimizer state alone exceed it.
void check_memory_fits(const TrainingMemory& memory, const Context& ctx, const std::string& device_description,
                       const std::string& hint, const std::string& state_hint);

// The state_hint for a run on `recipe`: the bf16 recipe's options it has not taken that shrink the
// per-parameter state, as config keys ("set master_weights: false, ...") or, with cli_flags, as
// bench's flags; then a smaller model.
std::string parameter_state_hint(const Recipe& recipe, bool cli_flags);

}  // namespace ingot
