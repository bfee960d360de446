// Temporary: ops not yet implemented on CUDA. Each moves to its own <op>.cu.
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"
#include "ingot/ops/cuda/device.h"

namespace ingot::cuda {

#define INGOT_CUDA_TODO(op) fail(#op ": not yet implemented on CUDA")

void embedding_forward(Context&, Tensor, Tensor, Tensor) { INGOT_CUDA_TODO(embedding_forward); }
void embedding_backward(Context&, Tensor, Tensor, Tensor) { INGOT_CUDA_TODO(embedding_backward); }
void rmsnorm_forward(Context&, Tensor, Tensor, Tensor, Tensor, double) { INGOT_CUDA_TODO(rmsnorm_forward); }
void rmsnorm_backward(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) { INGOT_CUDA_TODO(rmsnorm_backward); }
void qk_norm_forward(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, int, int, double) { INGOT_CUDA_TODO(qk_norm_forward); }
void qk_norm_backward(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int, int) { INGOT_CUDA_TODO(qk_norm_backward); }
void linear_forward(Context&, Tensor, Tensor, Tensor, Tensor) { INGOT_CUDA_TODO(linear_forward); }
void linear_backward(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) { INGOT_CUDA_TODO(linear_backward); }
void rope_forward(Context&, Tensor, Tensor, Tensor, int) { INGOT_CUDA_TODO(rope_forward); }
void rope_backward(Context&, Tensor, Tensor, Tensor, int) { INGOT_CUDA_TODO(rope_backward); }
void attention_forward(Context&, Tensor, Tensor, Tensor, Tensor, int, int, double) { INGOT_CUDA_TODO(attention_forward); }
void attention_backward(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int, int, double) { INGOT_CUDA_TODO(attention_backward); }
void swiglu_forward(Context&, Tensor, Tensor) { INGOT_CUDA_TODO(swiglu_forward); }
void swiglu_backward(Context&, Tensor, Tensor, Tensor) { INGOT_CUDA_TODO(swiglu_backward); }
void cross_entropy(Context&, Tensor, Tensor, Tensor, Tensor, double) { INGOT_CUDA_TODO(cross_entropy); }
void adamw_update(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, const AdamWHyper&) { INGOT_CUDA_TODO(adamw_update); }
double sum_squares(Context&, Tensor) { INGOT_CUDA_TODO(sum_squares); }
void sum_squares_async(Context&, const Tensor*, int, double*) { INGOT_CUDA_TODO(sum_squares_async); }

}  // namespace ingot::cuda
