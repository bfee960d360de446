// cuBLASLt GEMM with cached plans (see matmul.h). bf16/f16/f32 operands, f32 compute and scale.
#include <algorithm>
#include "ingot/ops/cuda/matmul.h"

namespace ingot::cuda {

namespace {

cudaDataType_t cuda_type(DType t, const char* op) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::f32: return CUDA_R_32F;
    default: fail(op, ": matmul does not take dtype ", dtype_name(t));
  }
}

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic must know it, since it
// assumes 256-byte alignment by default and a sliced pointer may have less.
int64_t alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && (u % uintptr_t(a)) != 0) a >>= 1;
  return a;
}

MatmulPlan create_plan(CudaState& state, const MatmulArgs& x, const char* op) {
  MatmulPlan plan;
  const cublasOperation_t ta = x.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = x.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  INGOT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  INGOT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  INGOT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (x.bias) {
    // Bias dtype is left at its default, D's dtype (callers pass a bias of c_type).
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    INGOT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                      &epilogue, sizeof(epilogue)));
  }
  // Stored shapes (column-major): op(A) is (m,k), op(B) is (k,n).
  const uint64_t a_rows = x.trans_a ? x.k : x.m, a_cols = x.trans_a ? x.m : x.k;
  const uint64_t b_rows = x.trans_b ? x.n : x.k, b_cols = x.trans_b ? x.k : x.n;
  INGOT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, cuda_type(x.a_type, op), a_rows, a_cols, x.lda));
  INGOT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, cuda_type(x.b_type, op), b_rows, b_cols, x.ldb));
  INGOT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, cuda_type(x.c_type, op), x.m, x.n, x.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  INGOT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  {
    const uint64_t ws = static_cast<uint64_t>(state.workspace_bytes);
    const uint32_t align_a = uint32_t(alignment(x.a)), align_b = uint32_t(alignment(x.b)),
                   align_c = uint32_t(std::min(alignment(x.c), x.c_in ? alignment(x.c_in) : alignment(x.c)));
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(state.cublaslt, plan.desc, plan.a, plan.b, plan.c,
                                              plan.c, pref, 1, &result, &returned);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  auto destroy = [&] {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
  };
  if (status != CUBLAS_STATUS_SUCCESS || returned == 0) {
    destroy();
    fail(op, ": cuBLASLt found no algorithm for m=", x.m, " n=", x.n, " k=", x.k, " trans_a=",
         x.trans_a, " trans_b=", x.trans_b, " types ", dtype_name(x.a_type), "/",
         dtype_name(x.b_type), "->", dtype_name(x.c_type), x.bias ? " +bias" : "", ": ",
         cublasLtGetStatusString(status));
  }
  plan.algo = result.algo;
  return plan;
}

}  // namespace

void matmul(CudaState& state, const MatmulArgs& x, const char* op) {
  if (x.m == 0 || x.n == 0) return;
  INGOT_CHECK(x.k > 0 || x.beta == 1.f, op, ": matmul with k = 0 and beta != 1");
  if (x.k == 0) return;  // C unchanged: beta == 1 and nothing to add
  const MatmulKey key{int64_t(x.trans_a), int64_t(x.trans_b), x.m, x.n, x.k, x.lda, x.ldb, x.ldc,
                      int64_t(x.a_type), int64_t(x.b_type), int64_t(x.c_type),
                      int64_t(x.bias != nullptr), alignment(x.a), alignment(x.b), alignment(x.c),
                      x.c_in ? int64_t(alignment(x.c_in)) : 0};
  auto it = state.matmul_plans.find(key);
  if (it == state.matmul_plans.end()) it = state.matmul_plans.emplace(key, create_plan(state, x, op)).first;
  MatmulPlan& plan = it->second;
  if (x.bias) {
    // The pointer is the one per-call attribute; the descriptor is host-side, so setting it here
    // is also correct during graph capture (the value is baked into the captured launch).
    const void* bias = x.bias;
    INGOT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof(bias)));
  }
  INGOT_CUBLAS_CHECK(cublasLtMatmul(state.cublaslt, plan.desc, &x.alpha, x.a, plan.a, x.b, plan.b,
                                    &x.beta, x.c_in ? x.c_in : x.c, plan.c, x.c, plan.c, &plan.algo, state.workspace,
                                    static_cast<size_t>(state.workspace_bytes), state.stream));
}

}  // namespace ingot::cuda
