// cuDNN fused flash attention for the causal GQA attention op (ops.h contract), and the dispatch
// switches shared by attention_forward.cu / attention_backward.cu. Plain C++ (no CUDA headers), so
// tests can ask which path ran.
//
// Dispatch (per call): cuDNN when it was compiled in (INGOT_HAVE_CUDNN and <cudnn.h>), the env var
// INGOT_ATTENTION is neither "kernels" nor "mma", tensors are bf16, D % 8 == 0 and D <= 128, and
// every pointer is 16-byte aligned: for whole rows alone, and for the forward over packed rows
// (segment ids) together with the tensor-core kernels (attention_documents.h); otherwise the
// tensor-core kernels where they apply (attention_mma.h), else the CUDA-core kernels. A graph
// that cuDNN rejects (no engine for the shape) is remembered and that shape falls back too, with
// one line on stderr.
//   INGOT_ATTENTION=mma         the tensor-core kernels wherever they apply (A/B tests)
//   INGOT_ATTENTION=kernels     the CUDA-core kernels always (A/B tests)
//   INGOT_ATTENTION=cudnn-fast  cuDNN, backward accumulating dQ in f32 with atomics: 5-20% faster
//                               backward, not bitwise reproducible
//   unset or empty              cuDNN, deterministic backward (dQ without atomics): the default,
//                               since a step repeated from the same state must be bitwise identical
//                               (where its workspace is within set_cudnn_backward_workspace_limit)
//   any other value             an error naming the variable and the value
//   INGOT_ATTENTION_REPORT=1    print, when a plan is built, every engine config
//                               cuDNN's heuristics offer (engine index, knob choices) and the
//                               one taken
//   INGOT_ATTENTION_WORKSPACE_MIB=N  cap the deterministic backward's workspace at N MiB below
//                               whatever limit is set (cudnn_backward_workspace_limit): slices,
//                               or at 0 the tensor-core backward, for A/B runs
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ingot/core/context.h"
#include "ingot/core/tensor.h"

namespace ingot::cuda {

// INGOT_ATTENTION, read per call so that tests can A/B in one process; a value not listed throws.
enum class AttentionMode {
  automatic,   // unset: cuDNN (deterministic backward), then the tensor-core kernels, then CUDA cores
  cudnn_fast,  // "cudnn-fast"
  mma,         // "mma"
  kernels,     // "kernels"
};
AttentionMode attention_mode();
// Reads every attention switch of the environment (INGOT_ATTENTION, _MMA_SYNC, _REPORT,
// _WORKSPACE_MIB), so that a malformed one stops a run before its first step, not inside it.
void check_attention_switches();

// "cudnn", "cudnn-split" (backward only: several calls, cudnn_backward_split), "cudnn-fast" (backward
// only), "cudnn+mma", "mma" or "kernels": the path the last attention call on this thread took
// ("none" before any call).
const char* attention_last_path();
void attention_set_last_path(const char* path);
bool attention_cudnn_compiled();
// The workspace cuDNN's deterministic backward plan for one call over (B, T, Hq, Hkv, D) reports
// (building the plan if it is new; not during graph capture), or -1 where cuDNN does not take the
// shape: how the tests hold cudnn_backward_plan_bytes to the cuDNN that is installed.
int64_t attention_cudnn_backward_workspace(Context& ctx, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D);

// cuDNN's deterministic backward keeps a B x Hq x T x T bf16 matrix in its workspace (measured in
// cuDNN 9.14): 4 GiB at 4 x 4096 x 32 heads, 64 GiB at 1 x 32768. Batch rows and kv-head groups are
// independent, so where one call's workspace would be above the limit set here, the backward of
// whole rows runs as several cuDNN calls over slices of the rows and of the kv heads (each kv head
// with its query heads): the largest slices within the limit (cudnn_backward_split). Only where
// not even one row's one kv-head group fits does it run on the tensor-core kernels (no workspace,
// slower). Process-wide; unlimited until set. A training run sets it from its memory plan
// (memory_plan.h, fit_attention_workspace).
void set_cudnn_backward_workspace_limit(int64_t bytes);
int64_t cudnn_backward_workspace_limit();  // the limit set, or INGOT_ATTENTION_WORKSPACE_MIB if lower
// B * Hq * T * T * 2, saturating at the largest int64: an absurd shape must not wrap around into one
// that fits.
inline int64_t cudnn_backward_workspace_bytes(int64_t B, int64_t T, int64_t Hq) {
  if (double(B) * double(Hq) * double(T) * double(T) * 2.0 >= 9.2e18) return std::numeric_limits<int64_t>::max();
  return B * Hq * T * T * 2;
}

// One cuDNN backward call's slice: `rows` batch rows by `kv_heads` kv heads, each with its
// Hq / Hkv query heads.
struct CudnnBackwardSplit {
  int64_t rows = 0, kv_heads = 0;
  bool fits() const { return rows > 0; }
  int64_t calls(int64_t B, int64_t Hkv) const { return (B / rows) * (Hkv / kv_heads); }
  int64_t workspace_bytes(int64_t T, int64_t Hq, int64_t Hkv) const {
    return cudnn_backward_workspace_bytes(rows, T, kv_heads * (Hq / Hkv));
  }
};

// The largest divisor d of n (>= 1) that is at most cap and for which d * unit is a multiple of 4
// (or d == n), in O(sqrt(n)) steps; 0 if none. Slices of the backward start every d * unit floats
// of lse, and cuDNN wants each start 16-byte aligned; d == n is no slicing at all.
inline int64_t largest_aligned_divisor_at_most(int64_t n, int64_t cap, int64_t unit) {
  int64_t best = 0;
  auto consider = [&](int64_t d) {
    if (d <= cap && (d == n || (d % 4) * (unit % 4) % 4 == 0)) best = std::max(best, d);
  };
  for (int64_t d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      consider(d);
      consider(n / d);
    }
  return best;
}

// The largest slices of a (B, T, Hq, Hkv) backward whose workspace is within limit_bytes, all of
// one size (one plan serves every call): every kv head and the most rows that divide B; else one
// row and the most kv heads that divide Hkv; else {0, 0} (nothing fits). Only slices whose lse
// starts are 16-byte aligned count (a slice starts at (b * Hq + q_head) * T floats): at a T that
// is not a multiple of 4 some slicings are left out, and the memory plan picks among the rest.
inline CudnnBackwardSplit cudnn_backward_split(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t limit_bytes) {
  if (B <= 0 || Hkv <= 0 || limit_bytes < 0) return {};
  const int64_t row = cudnn_backward_workspace_bytes(1, T, Hq);
  if (row == 0) return {B, Hkv};
  if (row <= limit_bytes) {
    const int64_t rows = largest_aligned_divisor_at_most(B, std::min(B, limit_bytes / row), Hq * T);
    if (rows > 0) return {rows, Hkv};
  }
  const int64_t kv_head = cudnn_backward_workspace_bytes(1, T, Hq / Hkv);
  if (kv_head > limit_bytes || (B > 1 && (Hq * T) % 4 != 0)) return {};
  const int64_t kv_heads = largest_aligned_divisor_at_most(Hkv, limit_bytes / kv_head, (Hq / Hkv) * T);
  return kv_heads > 0 ? CudnnBackwardSplit{1, kv_heads} : CudnnBackwardSplit{};
}

// The whole workspace cuDNN's deterministic backward plan reports for a (B, T, Hq) slice of head
// size D: the T x T bf16 matrix above, its sides padded to multiples of 64 and 128, an f32 dQ
// accumulator (B, Hq, T, D) and one f32 a query row. Within a kilobyte of every workspace
// tools/cudnn_workspace_probe.sh and CudaMemoryPlan.CudnnBackwardWorkspaceIsWhatThePlanCharges
// read from cuDNN 9.14 on an H200 (2026-12-02; docs/cuda.md), from 60 MiB at 2 x 1000 x 14 heads
// of 64 to 32898.0 MiB at 1 x 32768 x 16. The memory plan charges this plus
// kCudnnWorkspaceMarginBytes, and a plan that asks for more says so when it is built
// (attention_cudnn.cu). Saturates as above.
inline int64_t cudnn_backward_plan_bytes(int64_t B, int64_t T, int64_t Hq, int64_t D) {
  const int64_t T64 = (T + 63) / 64 * 64, T128 = (T + 127) / 128 * 128;
  const double per_head = 2.0 * double(T64) * double(T128) + double(T) * (4.0 * double(D) + 4.0);
  if (double(B) * double(Hq) * per_head >= 9.2e18) return std::numeric_limits<int64_t>::max();
  return B * Hq * (2 * T64 * T128 + T * (4 * D + 4));
}
// Room the memory plan leaves beside cuDNN's workspace for what another cuDNN version may add.
constexpr int64_t kCudnnWorkspaceMarginBytes = int64_t{16} << 20;
// What the memory plan charges one call: the two above, still saturating.
inline int64_t cudnn_backward_charge_bytes(int64_t B, int64_t T, int64_t Hq, int64_t D) {
  const int64_t plan = cudnn_backward_plan_bytes(B, T, Hq, D);
  return plan > std::numeric_limits<int64_t>::max() - kCudnnWorkspaceMarginBytes ? std::numeric_limits<int64_t>::max()
                                                                                : plan + kCudnnWorkspaceMarginBytes;
}

// Every distinct slicing of a (B, T, Hq, Hkv) backward, the one call first, then by workspace down
// to one row's one kv-head group: what a memory plan can choose from.
inline std::vector<CudnnBackwardSplit> cudnn_backward_splits(int64_t B, int64_t T, int64_t Hq, int64_t Hkv) {
  std::vector<CudnnBackwardSplit> splits;
  for (int64_t limit = std::numeric_limits<int64_t>::max();;) {
    const CudnnBackwardSplit split = cudnn_backward_split(B, T, Hq, Hkv, limit);
    if (!split.fits()) return splits;
    splits.push_back(split);
    const int64_t bytes = split.workspace_bytes(T, Hq, Hkv);
    if (bytes == 0) return splits;  // T == 0: nothing smaller
    limit = bytes - 1;
  }
}

// Scratch bytes an attention step over (B, T) rows of Hq query and Hkv kv heads of size D needs at
// most, for the memory plan before anything is allocated. Whole rows whose backward takes cuDNN
// with its workspace within cudnn_workspace_limit (cudnn_backward_split): above all one slice's
// cudnn_backward_plan_bytes and the margin (4226 MiB measured at 4 x 4096 x 32 heads of 64 in one
// call, where this gives 4242 MiB). Otherwise (whole rows on the tensor-core backward, or packed
// rows): the documents forward's table and dense stats, or the tensor-core backward's delta,
// whichever is larger.
// bf16 false (the fp32 recipe): neither cuDNN nor the tensor-core kernels run, only the kernels' delta.
int64_t attention_scratch_estimate(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, bool packed_rows,
                                   bool bf16, int64_t cudnn_workspace_limit);

// The largest head dim any attention path takes (cuDNN, the tensor-core and CUDA-core kernels).
constexpr int64_t kMaxAttentionHeadDim = 128;

// Where bf16 attention over (B, T) rows of Hq query and Hkv kv heads of size D runs, judged from the
// shapes and INGOT_ATTENTION alone (the per-call checks add pointer alignment): for the memory plan
// and its notes, before anything is allocated. Packed rows: cuDNN means the documents forward.
enum class AttentionKernels { cudnn, tensor_cores, cuda_cores };
AttentionKernels attention_kernels_for(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, bool packed_rows);

// Shared memory a block of the CUDA-core kernels takes at head dim D (the backward's, the larger):
// for the memory plan, which refuses a run whose attention can only take them on a GPU that gives
// less (sm_86/sm_89 at D = 128).
int64_t attention_kernels_smem_bytes(int64_t D);

// Return false when the cuDNN path does not take the call (the caller runs the kernels);
// arguments are already checked by the entry points.
bool attention_cudnn_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                             int n_q_heads, int n_kv_heads, double scale);
bool attention_cudnn_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                              Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                              double scale);

// Forward over packed rows (segment ids): the documents of at least kLongDocument tokens through
// cuDNN as variable-length sequences, the others through the tensor-core kernels
// (attention_documents.h). Path "cudnn+mma". Declines (false) where cuDNN is declined by
// INGOT_ATTENTION or rejects the graph, where the tensor-core kernels do not take the shape,
// where T > kDocumentTableMaxT, or where element offsets into qkv or into cuDNN's dense stats
// (documents, Hq, T) would not fit int32. The backward of packed rows stays on the tensor-core
// kernels.
bool attention_cudnn_documents_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv,
                                       Tensor segment_ids, int n_q_heads, int n_kv_heads, double scale);

}  // namespace ingot::cuda
