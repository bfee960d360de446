// Tensor-core flash attention (mma.sync, bf16 in, f32 accumulate) for the causal GQA attention op
// (ops.h contract): the path for what cuDNN does not take, above all packed batches (segment ids),
// where it skips every (query tile, key tile) pair whose documents cannot meet. Plain C++ (no CUDA
// headers). Kernels and layout: attention_mma.cuh; on an H100/H200 running sm_90a code the same
// kernels on wgmma (attention_wgmma.cuh) take every call this path takes, unless
// INGOT_ATTENTION_MMA_SYNC is set.
//
// Dispatch (per call, after cuDNN has declined): bf16 qkv/out/dout, D = 64 or 128, 16-byte
// aligned pointers, tiles that fit the device's shared memory per block (the D = 128 backward
// needs 104 KiB), and INGOT_ATTENTION not "kernels". INGOT_ATTENTION=mma makes cuDNN decline, so
// that this path also runs without segment ids (A/B tests and benchmarks).
#pragma once
#include <cstdint>

#include "ingot/core/context.h"
#include "ingot/core/tensor.h"

namespace ingot::cuda {

// The tokens the forward computes when cuDNN takes the others (attention_documents.h): only those
// with short_token[b * T + t] == 1 come out right, the rest (written or not) are cuDNN's to write
// afterwards. scratch_offset: bytes at the start of the CUDA scratch buffer the caller keeps.
struct MmaTokenSubset {
  const uint8_t* short_token = nullptr;  // (B, T), or null: every token
  int64_t scratch_offset = 0;
};

// Return false when this path does not take the call (the caller runs the CUDA-core kernels; the
// forward declines a scale that is not positive); arguments are already checked by the entry points.
bool attention_mma_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                           int n_q_heads, int n_kv_heads, double scale,
                           const MmaTokenSubset& subset = {});
bool attention_mma_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                            Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                            double scale);
// The shape half of attention_mma_supports: head dim 64 or 128, and rows and query heads within
// the grid's y and z dimensions. Also what the memory plan judges from, before any tensor exists.
inline bool attention_mma_takes_shapes(int64_t B, int64_t Hq, int64_t D) {
  return (D == 64 || D == 128) && B <= 65535 && Hq <= 65535;
}
// Whether the forward (or the backward) kernels take this shape on this device: what the entry
// points check first.
bool attention_mma_supports(Context& ctx, const Tensor& qkv, int n_q_heads, bool backward);
// The kernels of this thread's last tensor-core call (forward or backward): "wgmma" (Hopper, D = 64 or
// 128: attention_wgmma_*.cu) or "mma.sync" (attention_mma_*.cu); "none" before any.
const char* attention_mma_kernels();
// Whether the tensor-core calls of head dim D take the wgmma kernels on ctx's device now.
bool attention_wgmma_available(Context& ctx, int D);
// Shared memory a block of the mma.sync backward takes at head dim D (64 or 128; the wgmma kernels
// run only on Hopper, which gives every tile set room): for the memory plan.
int64_t attention_mma_backward_smem_bytes(int64_t D);
// Scratch bytes the forward takes with segment ids (its tile ranges), after subset.scratch_offset.
int64_t attention_mma_forward_scratch_bytes(int64_t B, int64_t T);

}  // namespace ingot::cuda
