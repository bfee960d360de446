#include "ingot/train/memory_plan.h"

#include "ingot/core/arena.h"
#include "ingot/model/parameters.h"
#include "ingot/model/transformer.h"
#include "ingot/optim/adamw.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <vector>

#include "ingot/core/error.h"
#ifdef INGOT_HAVE_CUDA
#include "ingot/ops/cuda/attention_cudnn.h"
#include "ingot/ops/cuda/attention_mma.h"
#include "ingot/ops/cuda/cuda_ops.h"
#include "ingot/ops/cuda/device.h"
#endif

namespace ingot {

#ifdef INGOT_HAVE_CUDA
namespace {
// cuDNN's backward workspace grows with T^2 and its estimate saturates at INT64_MAX for rows of
// hundreds of millions of tokens, where the plan's sums wrapped to negative totals. Capped here:
// more than any device holds, and sums of a few such stay within int64.
constexpr int64_t kBeyondAnyDevice = int64_t{1} << 60;

// The attention's scratch with cuDNN's backward workspace within limit (0: the tensor-core kernels).
int64_t attention_scratch(const TrainingMemory::Attention& a, int64_t limit) {
  return cuda::attention_scratch_estimate(a.B, a.T, a.Hq, a.Hkv, a.D, a.packed_rows, a.bf16, limit);
}

// The kernels that take a backward cuDNN does not: the tensor-core ones where their shapes allow.
std::string fallback_kernels(const TrainingMemory::Attention& a) {
  if (cuda::attention_mma_takes_shapes(a.B, a.Hq, a.D)) return "Ingot's tensor-core kernels";
  return "Ingot's CUDA-core kernels (head dim " + std::to_string(a.D) +
         ": the tensor-core ones take 64 and 128; several times slower, docs/cuda.md)";
}
}  // namespace
#endif

void check_cuda_model_shapes(const ModelConfig& config, const std::string& instead) {
#ifdef INGOT_HAVE_CUDA
  if (config.head_dim > cuda::kMaxAttentionHeadDim)
    fail("head_dim ", config.head_dim, " (key \"head_dim\", or hidden_size / num_attention_heads) is above ",
         cuda::kMaxAttentionHeadDim, ", the largest Ingot's CUDA attention takes; ", instead);
  if (config.hidden_size > cuda::rmsnorm_max_row_length(config.hidden_size))
    fail("hidden_size ", config.hidden_size, " is above ", cuda::rmsnorm_max_row_length(config.hidden_size),
         ", the longest row Ingot's CUDA RMSNorm takes", config.hidden_size % 8 ? " when it is not a multiple of 8" : "",
         "; ", instead);
#else
  (void)config, (void)instead;
#endif
}

std::string TrainingMemory::summary() const {
  return "params " + format_bytes(params) + " | grads " + format_bytes(grads) + " | master " + format_bytes(master) +
         " | optimizer " + format_bytes(optimizer) + " | activations " + format_bytes(activations) + " | scratch " +
         format_bytes(scratch) + " | total " + format_bytes(total());
}

TrainingMemory estimate_training_memory(const ModelConfig& config, const Recipe& recipe, Device device,
                                        int64_t micro_batch, int64_t seq_len, int64_t logits_chunk_tokens,
                                        Recompute recompute, bool packed_rows) {
  const auto model = Transformer::estimate_memory(config, recipe, micro_batch, seq_len, logits_chunk_tokens, recompute);
  const int64_t P = total_numel(plan_parameters(config));
  TrainingMemory m;
  m.params = model.params;
  m.grads = model.grads;
  m.activations = model.activations;
  m.master = AdamW::estimate_master_bytes(P, recipe);
  m.optimizer = AdamW::estimate_state_bytes(P, recipe);
  (void)packed_rows;  // only the CUDA scratch depends on it
#ifdef INGOT_HAVE_CUDA
  if (device == Device::cuda) {
    m.attention = {micro_batch, seq_len, config.num_attention_heads, config.num_key_value_heads,
                   config.head_dim /* set by the config parser */, packed_rows, recipe.activation == DType::bf16};
    // Refused here, before anything is allocated, rather than at the first attention call.
    check_cuda_model_shapes(config, "train it with device: cpu");
    // Whichever attention the shape picks, the CUDA-core kernels can end up running it (the fp32
    // recipe, a shape cuDNN declines, a workspace that does not fit), and their grid has a batch row
    // per block in z: refused for every shape, where it used to be only when the plan foresaw them.
    if (micro_batch > 65535)
      fail("micro-batch ", micro_batch, " is above 65535, the most rows Ingot's CUDA attention takes; "
           "use gradient_accumulation_steps for a larger batch");
    // A backward that can only end on the CUDA-core attention kernels, on a GPU that gives them too
    // little shared memory (sm_86/sm_89 at head_dim 128), is refused now, not in step 1. They take
    // it for the fp32 recipe, where the shape or INGOT_ATTENTION picks them, and where the
    // tensor-core kernels would (packed rows, or whole rows cuDNN does not take) but their tiles do
    // not fit either. (`ingot info` plans for CUDA on machines without a GPU: nothing to ask there.)
    const TrainingMemory::Attention& a = m.attention;
    if (cuda::device_available()) {
      const int64_t have = cuda::device_max_shared_memory_per_block();
      const cuda::AttentionKernels path = cuda::attention_kernels_for(a.B, a.T, a.Hq, a.Hkv, a.D, a.packed_rows);
      const bool tensor_core_backward = path == cuda::AttentionKernels::tensor_cores ||
                                        (path == cuda::AttentionKernels::cudnn && a.packed_rows);
      const bool cuda_core_backward = !a.bf16 || path == cuda::AttentionKernels::cuda_cores ||
                                      (tensor_core_backward && cuda::attention_mma_backward_smem_bytes(a.D) > have);
      if (const int64_t need = cuda::attention_kernels_smem_bytes(a.D); cuda_core_backward && need > have)
        fail("head_dim ", a.D, ": this run's attention backward takes Ingot's CUDA-core kernels (",
             !a.bf16 ? "the fp32 recipe" : path == cuda::AttentionKernels::cuda_cores ? "as the shape or INGOT_ATTENTION picks"
                                                                                       : "the tensor-core kernels' tiles do not fit",
             "), which need ", need, " bytes of shared memory a block at this head_dim, and this GPU gives ", have,
             "; train on a GPU with more (an A100 or H100), or on the CPU");
    }
    const int64_t without = attention_scratch(m.attention, 0);
    const int64_t with = std::min(attention_scratch(m.attention, std::numeric_limits<int64_t>::max()), kBeyondAnyDevice);
    m.attention_workspace = with - without;
    // The scratch buffer is shared, as large as its largest user. The embedding backward's (its
    // partial sums, ~N C / 8 bytes) can pass the attention's when the attention runs without a
    // workspace: charged where it does, at the most by what the attention always takes.
    const int64_t embedding = cuda::embedding_backward_scratch_bytes(micro_batch * seq_len, config.hidden_size);
    m.scratch = cuda::kCublasLtWorkspaceBytes + cuda::kScratchSlackBytes + with + std::max<int64_t>(0, embedding - without);
  }
#endif
  return m;
}

#ifdef INGOT_HAVE_CUDA
namespace {
// fit_attention_workspace without the environment's cap; *limit: the workspace limit it set.
std::string fit_attention_workspace_to_memory(TrainingMemory& memory, int64_t* limit) {
  const int64_t free_bytes = cuda::device_memory_free();
  *limit = std::numeric_limits<int64_t>::max();
  if (memory.attention_workspace == 0 || memory.total() <= free_bytes) {
    cuda::set_cudnn_backward_workspace_limit(*limit);
    return "";
  }
  const TrainingMemory::Attention& a = memory.attention;
  const int64_t whole = memory.attention_workspace;
  const int64_t rest = memory.total() - whole;
  const int64_t without = attention_scratch(a, 0);
  // The slices after the one call, from largest to smallest, until one fits beside the rest of the plan.
  const std::vector<cuda::CudnnBackwardSplit> splits = cuda::cudnn_backward_splits(a.B, a.T, a.Hq, a.Hkv);
  for (size_t i = 1; i < splits.size(); ++i) {
    const cuda::CudnnBackwardSplit& split = splits[i];
    const int64_t slice_workspace = split.workspace_bytes(a.T, a.Hq, a.Hkv);
    const int64_t needed = attention_scratch(a, slice_workspace) - without;
    if (rest + needed <= free_bytes) {
      memory.scratch += needed - whole;
      memory.attention_workspace = needed;
      *limit = slice_workspace;
      cuda::set_cudnn_backward_workspace_limit(slice_workspace);
      return "attention backward on cuDNN in " + std::to_string(split.calls(a.B, a.Hkv)) + " calls of " +
             std::to_string(split.rows) + " row(s) x " + std::to_string(split.kv_heads * (a.Hq / a.Hkv)) +
             " heads (" + format_bytes(needed) + " of scratch): one call would need " + format_bytes(whole) +
             ", which does not fit";
    }
  }
  const int64_t smallest_slice = attention_workspace_range(memory).smallest_slice;
  // At a T that is not a multiple of 4 the smallest aligned slice can be more than one row's one
  // kv-head group (cudnn_backward_split): the note names the one that was ruled out.
  const cuda::CudnnBackwardSplit smallest = splits.back();
  memory.scratch -= whole;
  memory.attention_workspace = 0;
  *limit = 0;
  cuda::set_cudnn_backward_workspace_limit(0);
  // A run that does not fit even so stops at check_memory_fits, whose message then gives the
  // smaller total; a note about a fallback that never runs would only mislead.
  if (memory.total() > free_bytes) return "";
  return "attention backward on " + fallback_kernels(a) + ": cuDNN's would need " + format_bytes(smallest_slice) +
         " of scratch even in its smallest slices, " + std::to_string(smallest.rows) + " row(s) x " +
         std::to_string(smallest.kv_heads * (a.Hq / a.Hkv)) + " heads a call (" + format_bytes(whole) +
         " in one call), which does not fit";
}
}  // namespace
#endif

std::string fit_attention_workspace(TrainingMemory& memory, const Context& ctx) {
#ifdef INGOT_HAVE_CUDA
  if (ctx.device != Device::cuda) return "";
  cuda::check_attention_switches();  // a malformed INGOT_ATTENTION* value fails here, not mid-step
  int64_t planned_limit = 0;
  const std::string note = fit_attention_workspace_to_memory(memory, &planned_limit);
  // INGOT_ATTENTION_WORKSPACE_MIB (A/B runs) can only lower the limit: the plan above still holds.
  // Where it changes what runs, the note names what does (the note is also the checkpoint's
  // attention_plan, which --resume compares); where it does not, the note is the plan's.
  const char* cap = std::getenv("INGOT_ATTENTION_WORKSPACE_MIB");
  if (memory.attention_workspace == 0 || cap == nullptr || *cap == 0) return note;
  const TrainingMemory::Attention& a = memory.attention;
  const cuda::CudnnBackwardSplit planned = cuda::cudnn_backward_split(a.B, a.T, a.Hq, a.Hkv, planned_limit);
  const cuda::CudnnBackwardSplit runs =
      cuda::cudnn_backward_split(a.B, a.T, a.Hq, a.Hkv, cuda::cudnn_backward_workspace_limit());
  if (runs.rows == planned.rows && runs.kv_heads == planned.kv_heads) return note;
  const std::string switch_set = std::string("INGOT_ATTENTION_WORKSPACE_MIB=") + cap;
  if (!runs.fits())
    return "attention backward on " + fallback_kernels(a) + ": " + switch_set +
           " caps cuDNN's workspace below its smallest slice (the plan above does not count the saving)";
  return "attention backward on cuDNN in " + std::to_string(runs.calls(a.B, a.Hkv)) + " calls of " +
         std::to_string(runs.rows) + " row(s) x " + std::to_string(runs.kv_heads * (a.Hq / a.Hkv)) + " heads (" +
         switch_set + " caps its workspace; the plan above does not count what it saves)";
#else
  (void)memory;
  (void)ctx;
  return "";
#endif
}

AttentionWorkspaceRange attention_workspace_range(const TrainingMemory& memory) {
  AttentionWorkspaceRange range;
#ifdef INGOT_HAVE_CUDA
  const TrainingMemory::Attention& a = memory.attention;
  if (memory.attention_workspace == 0) return range;
  range.one_call = memory.attention_workspace;
  const cuda::CudnnBackwardSplit smallest = cuda::cudnn_backward_splits(a.B, a.T, a.Hq, a.Hkv).back();
  range.smallest_slice =
      std::min(attention_scratch(a, smallest.workspace_bytes(a.T, a.Hq, a.Hkv)), kBeyondAnyDevice) - attention_scratch(a, 0);
#else
  (void)memory;
#endif
  return range;
}

std::string parameter_state_hint(const Recipe& recipe, bool cli_flags) {
  std::vector<std::string> options;
  if (recipe.name == "bf16") {
    if (recipe.master_weights) options.push_back(cli_flags ? "--no-master-weights" : "master_weights: false");
    if (recipe.grad == DType::f32) options.push_back(cli_flags ? "--grad-dtype bf16" : "grad_dtype: bf16");
    if (recipe.optimizer_state == DType::f32)
      options.push_back(cli_flags ? "--optimizer-state-dtype bf16" : "optimizer_state_dtype: bf16");
  }
  if (options.empty()) return "a smaller model, or a device with more memory";
  std::string joined;
  for (size_t i = 0; i < options.size(); ++i) joined += (i == 0 ? "" : i + 1 == options.size() ? " and " : ", ") + options[i];
  return (cli_flags ? "try " : "set ") + joined + ", or a smaller model";
}

void check_memory_fits(const TrainingMemory& memory, const Context& ctx, const std::string& device_description,
                       const std::string& hint, const std::string& state_hint) {
  int64_t available = 0;
#ifdef INGOT_HAVE_CUDA
  if (ctx.device == Device::cuda) available = cuda::device_memory_free();
#endif
  if (ctx.device == Device::cpu) available = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  if (available <= 0 || memory.total() <= available) return;
  // A smaller batch cannot help where the per-parameter state alone does not fit: the advice to
  // shrink it sent users after a batch of 1 x 1.
  const int64_t state = memory.params + memory.grads + memory.master + memory.optimizer;
  fail("the run needs ", format_bytes(memory.total()), " (", memory.summary(), ") but only ", format_bytes(available),
       " is available on ", device_description, "; ",
       state > available ? "the weights, gradients and optimizer state alone take " + format_bytes(state) +
                               ", so no smaller batch fits: " + state_hint
                         : hint);
}

}  // namespace ingot
