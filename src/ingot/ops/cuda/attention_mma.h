// Tensor-core flash attention (mma.sync, bf16 in, f32 accumulate) for the causal GQA attention op
// (ops.h contract): the path for what cuDNN does not take, above all packed batches (segment ids),
// where it skips every (query tile, key tile) pair whose documents cannot meet. Plain C++ (no CUDA
// headers). Kernels and layout: attention_mma.cuh.
//
// Dispatch (per call, after cuDNN has declined): bf16 qkv/out/dout, D = 64 or 128, 16-byte
// aligned pointers, tiles that fit the device's shared memory per block (the D = 128 backward
// needs 104 KiB), and INGOT_ATTENTION not "kernels". INGOT_ATTENTION=mma makes cuDNN decline, so
// that this path also runs without segment ids (A/B tests and benchmarks).
#pragma once
#include "ingot/core/context.h"
#include "ingot/core/tensor.h"

namespace ingot::cuda {

// Return false when this path does not take the call (the caller runs the CUDA-core kernels);
// arguments are already checked by the entry points.
bool attention_mma_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                           int n_q_heads, int n_kv_heads, double scale);
bool attention_mma_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                            Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                            double scale);

}  // namespace ingot::cuda
