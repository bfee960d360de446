// zero: x = 0 for any dtype (all-zero bits is 0 for every dtype Ingot stores).
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

void zero(Context& ctx, Tensor x) {
  CudaState& state = state_of(ctx, "zero");
  check_tensor(x, "zero", "x");
  INGOT_CUDA_CHECK(cudaMemsetAsync(x.data, 0, static_cast<size_t>(x.bytes()), state.stream));
}

}  // namespace ingot::cuda
