// Context: what every op needs besides its tensors: which backend runs it, how many CPU threads,
// and the CUDA state (stream, library handles, workspace), opaque here so CPU-only builds and
// .cpp files never see CUDA headers.
#pragma once
#include "ingot/core/tensor.h"

namespace ingot {

struct CudaState;  // defined in ops/cuda/cuda_state.h

struct Context {
  Device device = Device::cpu;
  int num_threads = 1;          // CPU ops split work over this many OpenMP threads
  CudaState* cuda = nullptr;    // set when device == cuda
};

}  // namespace ingot
