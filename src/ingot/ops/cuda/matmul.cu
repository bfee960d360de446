// cuBLASLt GEMM with cached plans (see matmul.h). bf16/f16/f32 operands, f32 compute and scale.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

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
// The bias pointer is the one per-call attribute; the descriptor is host-side, so setting it
// before each call is also correct during graph capture (the value is baked into the launch).
void set_bias_pointer(MatmulPlan& plan, const void* bias) {
  INGOT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof(bias)));
}

int64_t alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && (u % uintptr_t(a)) != 0) a >>= 1;
  return a;
}

// ---- choosing among the heuristic's candidates by timing ---------------------------------------
// cuBLASLt's first choice is often not its fastest on H200 (up to 9% slower on the step's shapes,
// docs/perf.md). When a plan is created outside graph capture, the heuristic's first kMaxCandidates
// algorithms without split-K are timed on the call's own operands, writing D into a temporary
// buffer so the caller's C is untouched. Only a candidate whose result equals the first choice's
// bit for bit may win: which one is fastest varies from run to run, the numbers must not.
// CudaState::gemm_tuning (INGOT_GEMM_TUNE) can keep the first choice or print every candidate.
constexpr int kMaxCandidates = 8;

// Counts 16-bit units that differ between a and b (both `units` long) into *count: 16 bits, so a
// bf16 output of odd length is compared to its last element.
__global__ void count_differences_kernel(const uint16_t* a, const uint16_t* b, int64_t units,
                                         unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < units;
       i += int64_t(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(count, local);
}

// An algorithm's config attribute as an int. The attributes have different widths (uint16_t
// cluster shape, uint32_t tile id, int32_t split-K) and cuBLASLt wants the exact size: ask for it
// first, then read that many bytes into a zeroed (little-endian) word.
int algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  size_t size = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS ||
      size == 0 || size > sizeof(uint64_t))
    return 0;
  uint64_t value = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, size, &written) != CUBLAS_STATUS_SUCCESS)
    return 0;
  return int(value);  // every attribute read here is a small non-negative count or id
}

// Only GEMMs of at least this many FLOPs and output elements are timed: below that the gain is
// microseconds, and a small output compared once could hide a different summation order behind
// its rounding (a candidate must give the first choice's bits on every later input too).
constexpr double kMinTimedFlops = 1e10;
constexpr int64_t kMinTimedOutputs = int64_t(1) << 20;

// Index of the fastest candidate whose output equals candidate 0's; 0 when none is timed.
int choose_by_timing(CudaState& state, const MatmulArgs& x, const MatmulPlan& plan,
                     const cublasLtMatmulHeuristicResult_t* candidates, int count, const char* op) {
  if (count < 2 || state.capturing) return 0;
  if (2.0 * double(x.m) * double(x.n) * double(x.k) < kMinTimedFlops || x.m * x.n < kMinTimedOutputs) return 0;
  const int64_t elem = x.c_type == DType::f32 ? 4 : 2;
  const size_t d_bytes = size_t(x.ldc) * size_t(x.n) * size_t(elem);
  // Two outputs, a counter and two events, released on every way out (a throw included); when
  // memory is short, keep the heuristic's choice.
  struct Scratch {
    void* outputs[2] = {nullptr, nullptr};
    unsigned long long* differences = nullptr;
    cudaEvent_t start = nullptr, end = nullptr;
    ~Scratch() {
      cudaFree(outputs[0]);
      cudaFree(outputs[1]);
      cudaFree(differences);
      if (start) cudaEventDestroy(start);
      if (end) cudaEventDestroy(end);
    }
  } scratch;
  if (cudaMalloc(&scratch.outputs[0], d_bytes) != cudaSuccess || cudaMalloc(&scratch.outputs[1], d_bytes) != cudaSuccess ||
      cudaMalloc(&scratch.differences, sizeof(unsigned long long)) != cudaSuccess ||
      cudaEventCreate(&scratch.start) != cudaSuccess || cudaEventCreate(&scratch.end) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const void* c_read = x.c_in ? x.c_in : x.c;
  const bool report = state.gemm_tuning == GemmTuning::timed_report;
  const double flops = 2.0 * double(x.m) * double(x.n) * double(x.k);
  if (report)
    std::fprintf(stderr, "[gemm] %s m=%ld n=%ld k=%ld ta=%d tb=%d %s*%s->%s beta=%g%s\n", op, long(x.m),
                 long(x.n), long(x.k), int(x.trans_a), int(x.trans_b), dtype_name(x.a_type).data(),
                 dtype_name(x.b_type).data(), dtype_name(x.c_type).data(), double(x.beta),
                 x.bias ? " +bias" : "");
  int best = 0;
  float best_ms = 0.f;
  for (int i = 0; i < count; ++i) {
    void* d = scratch.outputs[i == 0 ? 0 : 1];
    float ms[5];
    bool ran = true;
    for (int r = -1; r < 5 && ran; ++r) {  // one untimed run first
      INGOT_CUDA_CHECK(cudaEventRecord(scratch.start, state.stream));
      // A candidate the library cannot run on these operands is left out, not fatal; the first
      // choice failing ends the timing (the real call will report it).
      ran = cublasLtMatmul(state.cublaslt, plan.desc, &x.alpha, x.a, plan.a, x.b, plan.b, &x.beta, c_read,
                           plan.c, d, plan.c, &candidates[i].algo, state.workspace,
                           size_t(state.workspace_bytes), state.stream) == CUBLAS_STATUS_SUCCESS;
      INGOT_CUDA_CHECK(cudaEventRecord(scratch.end, state.stream));
      INGOT_CUDA_CHECK(cudaEventSynchronize(scratch.end));
      if (ran && r >= 0) INGOT_CUDA_CHECK(cudaEventElapsedTime(&ms[r], scratch.start, scratch.end));
    }
    if (!ran) {
      cudaGetLastError();  // a launch failure inside cuBLASLt must not surface at the next check
      if (report) std::fprintf(stderr, "[gemm]   #%d failed to run: excluded\n", i);
      if (i == 0) return 0;
      continue;
    }
    std::sort(ms, ms + 5);
    const float median = ms[2];
    unsigned long long differing = 0;
    if (i > 0) {
      INGOT_CUDA_CHECK(cudaMemsetAsync(scratch.differences, 0, sizeof(unsigned long long), state.stream));
      count_differences_kernel<<<state.num_sms * 4, 256, 0, state.stream>>>(
          static_cast<const uint16_t*>(scratch.outputs[0]), static_cast<const uint16_t*>(scratch.outputs[1]),
          int64_t(d_bytes / 2), scratch.differences);
      INGOT_LAUNCH_CHECK("count_differences_kernel");
      INGOT_CUDA_CHECK(cudaMemcpyAsync(&differing, scratch.differences, sizeof(differing), cudaMemcpyDeviceToHost,
                                       state.stream));
      INGOT_CUDA_CHECK(cudaStreamSynchronize(state.stream));
    }
    if (i == 0 || (differing == 0 && median < best_ms)) {
      best = i;
      best_ms = median;
    }
    if (report)
      std::fprintf(stderr, "[gemm]   #%d tile=%d stages=%d cluster=%d swizzle=%d waves=%.2f  %.3f ms  %.0f TFLOP/s  %s\n",
                   i, algo_config(candidates[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                   algo_config(candidates[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                   algo_config(candidates[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                   algo_config(candidates[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                   double(candidates[i].wavesCount), double(median), flops / (double(median) * 1e-3) / 1e12,
                   differing ? "different bits: excluded" : "same bits");
  }
  if (report) std::fprintf(stderr, "[gemm]   chosen #%d\n", best), std::fflush(stderr);
  return best;
}

// Destroys what a plan under construction holds unless released: every throw on the way (a failed
// create, a dtype cuda_type refuses, the timing) used to leak the descriptors made before it.
struct PlanUnderConstruction {
  MatmulPlan plan;
  bool released = false;
  ~PlanUnderConstruction() {
    if (!released) destroy_matmul_plan(plan);
  }
  MatmulPlan release() {
    released = true;
    return plan;
  }
};

MatmulPlan create_plan(CudaState& state, const MatmulArgs& x, const char* op) {
  PlanUnderConstruction building;
  MatmulPlan& plan = building.plan;
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
  INGOT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));  // destroyed below, before anything can throw
  const int wanted = state.gemm_tuning == GemmTuning::first_choice ? 1 : kMaxCandidates;
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
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
                                              plan.c, pref, wanted, results, &returned);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || returned == 0) {
    fail(op, ": cuBLASLt found no algorithm for m=", x.m, " n=", x.n, " k=", x.k, " trans_a=",
         x.trans_a, " trans_b=", x.trans_b, " types ", dtype_name(x.a_type), "/",
         dtype_name(x.b_type), "->", dtype_name(x.c_type), x.bias ? " +bias" : "", ": ",
         cublasLtGetStatusString(status));
  }
  // Split-K candidates sum partial products in another order (different bits); drop them.
  int usable = 0;
  for (int i = 0; i < returned; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (i > 0 && (algo_config(results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1 ||
                  algo_config(results[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) != 0))
      continue;
    results[usable++] = results[i];
  }
  if (usable == 0) fail(op, ": cuBLASLt returned no usable algorithm for m=", x.m, " n=", x.n, " k=", x.k);
  if (x.bias) set_bias_pointer(plan, x.bias);
  plan.algo = results[choose_by_timing(state, x, plan, results, usable, op)].algo;
  return building.release();
}

}  // namespace

void matmul(CudaState& state, const MatmulArgs& x, const char* op) {
  if (x.m == 0 || x.n == 0) return;
  INGOT_CHECK(x.k > 0 || x.beta == 1.f, op, ": matmul with k = 0 and beta != 1");
  if (x.k == 0) return;  // C unchanged: beta == 1 and nothing to add
  const MatmulKey key{int64_t(x.trans_a), int64_t(x.trans_b), x.m, x.n, x.k, x.lda, x.ldb, x.ldc,
                      int64_t(x.a_type), int64_t(x.b_type), int64_t(x.c_type),
                      int64_t(x.bias != nullptr), alignment(x.a), alignment(x.b), alignment(x.c),
                      x.c_in ? int64_t(alignment(x.c_in)) : 0,
                      // The timing's same-bits check ran at this beta; whether C is read is part of that.
                      int64_t(x.beta != 0.f)};
  auto it = state.matmul_plans.find(key);
  if (it == state.matmul_plans.end()) it = state.matmul_plans.emplace(key, create_plan(state, x, op)).first;
  MatmulPlan& plan = it->second;
  if (x.bias) set_bias_pointer(plan, x.bias);
  INGOT_CUBLAS_CHECK(cublasLtMatmul(state.cublaslt, plan.desc, &x.alpha, x.a, plan.a, x.b, plan.b,
                                    &x.beta, x.c_in ? x.c_in : x.c, plan.c, x.c, plan.c, &plan.algo, state.workspace,
                                    static_cast<size_t>(state.workspace_bytes), state.stream));
}

}  // namespace ingot::cuda
