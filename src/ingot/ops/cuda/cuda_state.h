// CudaState: everything a CUDA op needs besides its tensors: the stream every op runs on, the
// cuBLASLt handle with its preallocated workspace and cached matmul plans, a growable scratch
// buffer for multi-kernel ops, and the step's captured CUDA graph. Context holds it opaquely
// (core/context.h), so only .cu files see this header.
// Invariants:
//   - Every op enqueues on `stream` and never synchronises; only the explicit helpers in device.h
//     (blocking copies, synchronize, event waits) and scratch growth do.
//   - Scratch grows only outside graph capture (cudaMalloc is not capturable); an op that needs
//     more scratch during capture throws. Warm up one step uncaptured before capturing.
//   - A matmul plan (layouts + algorithm timed among bit-identical candidates) is chosen once per
//     key and reused.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>

// cuDNN is optional: CMake defines INGOT_HAVE_CUDNN when it finds the library, and the header
// must be on the include path too (on Debian it may sit under /usr/include/<triplet>).
#if defined(INGOT_HAVE_CUDNN) && __has_include(<cudnn.h>)
#include <cudnn.h>
#define INGOT_CUDA_USE_CUDNN 1
#endif

namespace ingot {

// Key of a cached cuBLASLt plan: op flags, sizes, leading dims, dtypes, epilogue, alignments,
// whether beta is nonzero.
using MatmulKey = std::array<int64_t, 17>;

struct MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
// Destroys what the plan holds (any part may be null); never throws.
void destroy_matmul_plan(MatmulPlan& plan);

// How a new matmul plan picks its algorithm (matmul.cu). INGOT_GEMM_TUNE sets it at create_state:
// "0" first_choice, "report" timed_report, anything else (or unset) timed.
enum class GemmTuning {
  first_choice,  // the cuBLASLt heuristic's first candidate
  timed,         // the fastest candidate that gives the first candidate's exact bits
  timed_report,  // timed, and every candidate printed
};

struct CudaState {
  int device = 0;
  int num_sms = 0;                  // multiprocessors, for persistent / partial-sum grids
  int max_smem_per_block = 0;       // opt-in dynamic shared memory limit (bytes)
  bool wgmma_code = false;          // the attention kernels' sm_90a (wgmma) code runs here
  cudaStream_t stream = nullptr;

  cublasLtHandle_t cublaslt = nullptr;
  void* workspace = nullptr;        // cuBLASLt workspace, preallocated
  int64_t workspace_bytes = 0;      // (32 MiB)
  std::map<MatmulKey, MatmulPlan> matmul_plans;
  GemmTuning gemm_tuning = GemmTuning::timed;

  void* scratch = nullptr;          // partial sums, sort buffers; stream-ordered reuse between ops
  int64_t scratch_bytes = 0;
  int64_t scratch_generation = 0;   // bumped whenever scratch moves


  cudaGraph_t graph = nullptr;      // the captured step
  cudaGraphExec_t graph_exec = nullptr;
  bool capturing = false;
};

// Scratch of at least `bytes`, 256-byte aligned; grows (synchronising) outside capture only.
void* scratch_buffer(CudaState& state, int64_t bytes, const char* op);

}  // namespace ingot
