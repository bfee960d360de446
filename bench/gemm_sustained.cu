// cuBLASLt's candidate algorithms for Llama-3.2-1B's largest GEMMs (4096 x 4 tokens), each timed
// twice: a short burst after a rest (the GPU at its boost clock, as the per-shape timing in
// matmul.cu sees it) and a sustained stretch of back-to-back calls (the GPU at its power limit, as
// a training step runs). Question it answers: would choosing algorithms by sustained throughput
// pick differently from choosing by bursts? The candidates are the ones matmul.cu times: the
// heuristic's first 8 for a 32 MiB workspace and 256-byte-aligned operands, split-K ones dropped
// after the first.
//   build: nvcc -O2 -arch=sm_90a -o /tmp/gemm_sustained bench/gemm_sustained.cu -lcublasLt
//   run:   /tmp/gemm_sustained [SECONDS_PER_CANDIDATE=1.5]
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#define CHECK(call)                                                                        \
  do {                                                                                     \
    const int status_ = int(call);                                                         \
    if (status_ != 0) {                                                                    \
      std::fprintf(stderr, "%s failed with status %d (line %d)\n", #call, status_, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// Uniform values in (-0.035, 0.035) from a hash of the index: weight-like magnitudes, no RNG state.
__global__ void fill_kernel(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = (unsigned(i) * 2654435761u) ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffffff) / float(0x1000000) - 0.5f) * 0.07f);
  }
}

struct Shape {
  const char* name;
  int m, n, k;          // column-major D (m,n) = op(A) (m,k) * op(B) (k,n), as matmul.cu calls it
  bool trans_a, trans_b;
  bool f32_out;         // weight gradients accumulate in f32
};

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.5;
  if (!(seconds > 0)) {
    std::fprintf(stderr, "usage: %s [SECONDS_PER_CANDIDATE > 0], got '%s'\n", argv[0], argc > 1 ? argv[1] : "");
    return 2;
  }
  const Shape shapes[] = {
      {"gate_up forward: (16384 tokens, 2048) -> 16384", 16384, 16384, 2048, true, false, false},
      {"down forward: (16384 tokens, 8192) -> 2048", 2048, 16384, 8192, true, false, false},
      {"gate_up weight gradient: 16384 x 2048 over 16384 tokens", 2048, 16384, 16384, false, true, true},
  };
  cublasLtHandle_t lt;
  CHECK(cublasLtCreate(&lt));
  const size_t workspace_bytes = size_t(32) << 20;  // CudaState's cuBLASLt workspace
  void* workspace;
  CHECK(cudaMalloc(&workspace, workspace_bytes));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, end;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&end));

  for (const Shape& s : shapes) {
    __nv_bfloat16 *a, *b;
    void* d;
    CHECK(cudaMalloc(&a, size_t(s.m) * s.k * 2));
    CHECK(cudaMalloc(&b, size_t(s.k) * s.n * 2));
    CHECK(cudaMalloc(&d, size_t(s.m) * s.n * 4));
    fill_kernel<<<1024, 256>>>(a, size_t(s.m) * s.k, 1);
    fill_kernel<<<1024, 256>>>(b, size_t(s.k) * s.n, 2);

    cublasLtMatmulDesc_t desc;
    CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtMatrixLayout_t la, lb, ld;
    CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.trans_a ? s.k : s.m));
    CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.trans_b ? s.n : s.k));
    CHECK(cublasLtMatrixLayoutCreate(&ld, s.f32_out ? CUDA_R_32F : CUDA_R_16BF, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref;
    CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_workspace = workspace_bytes;
    CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                               sizeof max_workspace));
    const uint32_t alignment = 256;
    for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                           CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &alignment, sizeof alignment));
    cublasLtMatmulHeuristicResult_t returned[8], candidates[8];
    int returned_count = 0, count = 0;
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, returned, &returned_count));
    for (int i = 0; i < returned_count; ++i) {  // as matmul.cu: split-K sums in another order
      int split_k = 1;
      uint32_t reduction = 0;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&returned[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof split_k, &written);
      cublasLtMatmulAlgoConfigGetAttribute(&returned[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction,
                                           sizeof reduction, &written);
      if (returned[i].state != CUBLAS_STATUS_SUCCESS || (i > 0 && (split_k > 1 || reduction != 0))) continue;
      candidates[count++] = returned[i];
    }
    const float alpha = 1.f, beta = 0.f;
    const double flops = 2.0 * s.m * s.n * s.k;
    std::printf("%s: %d candidates (TFLOP/s burst / sustained)\n", s.name, count);

    for (int i = 0; i < count; ++i) {
      auto gemm = [&] {
        return cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &candidates[i].algo, workspace,
                              workspace_bytes, stream);
      };
      if (gemm() != CUBLAS_STATUS_SUCCESS) {
        std::printf("  #%d does not run\n", i);
        continue;
      }
      CHECK(cudaStreamSynchronize(stream));
      std::this_thread::sleep_for(std::chrono::seconds(2));  // let the clock recover from the last one
      CHECK(cudaEventRecord(start, stream));
      for (int r = 0; r < 5; ++r) gemm();
      CHECK(cudaEventRecord(end, stream));
      CHECK(cudaEventSynchronize(end));
      float burst_ms;
      CHECK(cudaEventElapsedTime(&burst_ms, start, end));
      burst_ms /= 5;
      // Sustained: back-to-back calls for `seconds`; only the second half is timed (at least one
      // batch of 10), when the power limit has long been reached.
      int timed_calls = 0;
      const auto t0 = std::chrono::steady_clock::now();
      auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
      bool timing = false;
      while (!timing || elapsed() < seconds) {
        if (!timing && elapsed() >= seconds / 2) {
          CHECK(cudaEventRecord(start, stream));
          timing = true;
        }
        for (int r = 0; r < 10; ++r) gemm();
        if (timing) timed_calls += 10;
        CHECK(cudaStreamSynchronize(stream));
      }
      CHECK(cudaEventRecord(end, stream));
      CHECK(cudaEventSynchronize(end));
      float sustained_ms;
      CHECK(cudaEventElapsedTime(&sustained_ms, start, end));
      sustained_ms /= float(timed_calls);
      int tile = 0;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&candidates[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
      std::printf("  #%d tile %3d: %4.0f / %4.0f\n", i, tile, flops / (burst_ms * 1e-3) / 1e12,
                  flops / (sustained_ms * 1e-3) / 1e12);
      std::fflush(stdout);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
  }
  return 0;
}
