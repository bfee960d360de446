// Shared pieces of every CUDA op: status checks that throw ingot::Error naming the call, file and
// line; tensor argument checks; bf16/f32 conversion; 8-element vector loads (16 bytes of bf16)
// and warp/block reductions with a fixed order, so that results are bitwise reproducible.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ingot/core/context.h"
#include "ingot/core/error.h"
#include "ingot/core/tensor.h"
#include "ingot/ops/cuda/cuda_state.h"

#define INGOT_CUDA_CHECK(call)                                                                  \
  do {                                                                                          \
    const cudaError_t status_ = (call);                                                         \
    if (status_ != cudaSuccess)                                                                 \
      ::ingot::fail("CUDA error: ", #call, " failed at ", __FILE__, ":", __LINE__, ": ",        \
                    cudaGetErrorName(status_), " (", cudaGetErrorString(status_), ")");         \
  } while (0)

#define INGOT_CUBLAS_CHECK(call)                                                                \
  do {                                                                                          \
    const cublasStatus_t status_ = (call);                                                      \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::ingot::fail("cuBLAS error: ", #call, " failed at ", __FILE__, ":", __LINE__, ": ",      \
                    cublasLtGetStatusString(status_));                                          \
  } while (0)

// After every kernel launch: catches bad launch configurations at the call that made them.
#define INGOT_LAUNCH_CHECK(kernel_name)                                                         \
  do {                                                                                          \
    const cudaError_t status_ = cudaGetLastError();                                             \
    if (status_ != cudaSuccess)                                                                 \
      ::ingot::fail("CUDA launch of ", kernel_name, " failed at ", __FILE__, ":", __LINE__,     \
                    ": ", cudaGetErrorName(status_), " (", cudaGetErrorString(status_), ")");   \
  } while (0)

namespace ingot::cuda {

using bf16 = __nv_bfloat16;

// ---- host-side argument checks --------------------------------------------------------------
inline CudaState& state_of(Context& ctx, const char* op) {
  INGOT_CHECK(ctx.cuda != nullptr, op, ": Context has no CUDA state (create_state first)");
  return *ctx.cuda;
}

inline void check_tensor(const Tensor& t, const char* op, const char* name) {
  INGOT_CHECK(t.present(), op, ": tensor '", name, "' is absent");
  INGOT_CHECK(t.device == Device::cuda, op, ": tensor '", name, "' is not on the CUDA device");
}

inline void check_dtype(const Tensor& t, DType want, const char* op, const char* name) {
  INGOT_CHECK(t.dtype == want, op, ": tensor '", name, "' has dtype ", dtype_name(t.dtype),
              ", expected ", dtype_name(want));
}

inline void check_float(const Tensor& t, const char* op, const char* name) {
  INGOT_CHECK(t.dtype == DType::bf16 || t.dtype == DType::f32, op, ": tensor '", name,
              "' has dtype ", dtype_name(t.dtype), "; CUDA ops take bf16 or f32");
}

inline void check_numel(const Tensor& t, int64_t want, const char* op, const char* name) {
  INGOT_CHECK(t.numel() == want, op, ": tensor '", name, "' ", t.shape_string(), " has ",
              t.numel(), " elements, expected ", want);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Calls f(T{}) with T = bf16 or float according to dtype.
template <typename F>
void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::bf16: f(bf16{}); return;
    case DType::f32: f(float{}); return;
    default: fail(op, ": unsupported dtype ", dtype_name(dtype), " (CUDA ops take bf16 or f32)");
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid for a grid-stride loop over `work` items: enough blocks to fill the GPU, no more.
inline unsigned grid_for(int64_t work, int threads, const CudaState& state) {
  const int64_t blocks = ceil_div(work, threads);
  const int64_t cap = int64_t(state.num_sms) * 16;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

// ---- device-side conversion ----------------------------------------------------------------
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// 8 consecutive elements <-> 8 floats. p must be 16-byte aligned (bf16: one 16-byte access;
// f32: two).
__device__ __forceinline__ void load8(const bf16* p, float (&f)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ void load8(const float* p, float (&f)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
  f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}
__device__ __forceinline__ void store8(bf16* p, const float (&f)[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}
__device__ __forceinline__ void store8(float* p, const float (&f)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

// VEC elements (8: one 16-byte bf16 access; 1: scalar fallback for odd row lengths).
template <int VEC, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[VEC]) {
  if constexpr (VEC == 8) {
    load8(p, f);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) f[k] = to_f32(p[k]);
  }
}
template <int VEC, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[VEC]) {
  if constexpr (VEC == 8) {
    store8(p, f);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[k] = from_f32<T>(f[k]);
  }
}

// ---- reductions with a fixed tree (bitwise reproducible) -------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 floats; the call ends with the buffer free for reuse.
__device__ __forceinline__ float block_sum(float x, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_sum(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  float total = lane < warps ? shared[lane] : 0.f;
  total = warp_sum(total);
  __syncthreads();
  return total;
}

// ---- raw 8-element chunks: load now, convert at use (16 bytes of bf16 = 4 registers) --------
// Lets a thread hold a whole row with several loads in flight before the first use.
template <typename T> struct Raw8;
template <> struct Raw8<bf16> { uint4 u; };
template <> struct Raw8<float> { float4 a, b; };

__device__ __forceinline__ void load_raw8(const bf16* p, Raw8<bf16>& r) {
  r.u = *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void load_raw8(const float* p, Raw8<float>& r) {
  r.a = reinterpret_cast<const float4*>(p)[0];
  r.b = reinterpret_cast<const float4*>(p)[1];
}
__device__ __forceinline__ void unpack8(const Raw8<bf16>& r, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r.u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ void unpack8(const Raw8<float>& r, float (&f)[8]) {
  f[0] = r.a.x; f[1] = r.a.y; f[2] = r.a.z; f[3] = r.a.w;
  f[4] = r.b.x; f[5] = r.b.y; f[6] = r.b.z; f[7] = r.b.w;
}

__device__ __forceinline__ void store_raw8(bf16* p, const Raw8<bf16>& r) {
  *reinterpret_cast<uint4*>(p) = r.u;
}
__device__ __forceinline__ void store_raw8(float* p, const Raw8<float>& r) {
  reinterpret_cast<float4*>(p)[0] = r.a;
  reinterpret_cast<float4*>(p)[1] = r.b;
}

// Sum over aligned groups of LANES consecutive lanes (LANES a power of two <= 32); every lane of
// the group gets the group's sum. All 32 lanes must call it (full-warp shuffles).
template <int LANES>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = LANES / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace ingot::cuda

namespace ingot::cuda {
// dweight (C) += sum over g < G of partial (G, ld)[:, :C] f32, summed in g order
// (deterministic). dweight is bf16 or f32. Defined in rmsnorm.cu; used by every op with
// per-block partial sums.
void column_partials_accumulate(CudaState& state, Tensor dweight, const float* partial, int64_t G,
                                int64_t C, int64_t ld, const char* op);
}  // namespace ingot::cuda
