// Temporary: ops not yet implemented on CUDA. Each moves to its own <op>.cu.
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"
#include "ingot/ops/cuda/device.h"

namespace ingot::cuda {

#define INGOT_CUDA_TODO(op) fail(#op ": not yet implemented on CUDA")

void linear_forward(Context&, Tensor, Tensor, Tensor, Tensor) { INGOT_CUDA_TODO(linear_forward); }
void linear_backward(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) { INGOT_CUDA_TODO(linear_backward); }
void attention_forward(Context&, Tensor, Tensor, Tensor, Tensor, int, int, double) { INGOT_CUDA_TODO(attention_forward); }
void attention_backward(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int, int, double) { INGOT_CUDA_TODO(attention_backward); }

}  // namespace ingot::cuda
