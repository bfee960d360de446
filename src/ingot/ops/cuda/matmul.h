// cuBLASLt GEMM with a per-shape plan cache: the one GEMM entry of the CUDA backend, so that a
// precision recipe (FP8 inputs and scales later) changes this call, not its callers.
// Column-major convention of cuBLAS: C (m,n) = alpha * op(A) op(B) + beta * C (+ bias (m) per row
// with the BIAS epilogue). Row-major callers swap operands (see linear.cu).
#pragma once
#include "ingot/ops/cuda/common.cuh"

namespace ingot::cuda {

struct MatmulArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  int64_t lda = 0; DType a_type = DType::bf16;
  const void* b = nullptr;  int64_t ldb = 0; DType b_type = DType::bf16;
  void* c = nullptr;        int64_t ldc = 0; DType c_type = DType::bf16;
  const void* c_in = nullptr;  // when set, read as C (same layout as c) and c only written (D)
  float alpha = 1.f, beta = 0.f;
  const void* bias = nullptr;  // (m), dtype c_type; nullptr: no bias epilogue
};

// Enqueues the GEMM on state.stream. The algorithm is chosen the first time a (shape, layout,
// dtype, epilogue, alignment) key is seen, then reused: the fastest, timed on the call's operands,
// of the cuBLASLt heuristic's candidates that give the first candidate's exact bits (matmul.cu).
void matmul(CudaState& state, const MatmulArgs& args, const char* op);

}  // namespace ingot::cuda
