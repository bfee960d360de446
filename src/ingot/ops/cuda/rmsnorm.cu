// RMSNorm over rows of (R,C). rstd (R) f32.
// Invariants:
//   - Row path (C % 8 == 0, C <= 2048, aligned): one warp per row; lane owns the 16-byte chunks
//     c = lane + 32k (k < P), so the row lives in registers and every load of a row (x, dout and,
//     in the backward, din) is issued before the first use: one memory round trip per row, no
//     block barriers.
//   - Block path (longer rows, or the scalar fallback): one block per row (grid-stride); each
//     thread keeps P chunks of VEC elements in registers; fixed-tree block reduction.
//   - Backward: din ACCUMULATES (residual-stream gradient). dweight accumulates deterministically:
//     a fixed grid of G persistent blocks (G from R, the SM count and the kernel's occupancy, all
//     fixed for a binary on a GPU) each sums its rows' dout*x*rstd into an f32 partial row (row
//     path: per warp in shared memory, then the warps in order); column_partials_accumulate then
//     adds the G partials to dweight in a fixed order.
//   - C is limited to 256 threads * P_max * VEC (16384 vector, 2048 scalar).
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

constexpr int kThreads = 256;
static_assert(rmsnorm_max_row_length(8) == 8 * 8 * kThreads && rmsnorm_max_row_length(1) == 8 * kThreads,
              "dispatch_row takes up to 8 vectors a thread");

template <int VEC, int P, typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_forward_kernel(T* out, float* rstd, const T* in, const T* weight,
                                       int64_t R, int64_t C, float eps) {
  __shared__ float reduce[32];
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    const T* x_row = in + row * C;
    float x[P][VEC];
    float sum_sq = 0.f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
      if (c < C) {
        load_vec<VEC>(x_row + c, x[k]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) sum_sq += x[k][e] * x[k][e];
      }
    }
    sum_sq = block_sum(sum_sq, reduce);
    const float r = rsqrtf(sum_sq / float(C) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
      if (c < C) {
        float w[VEC], y[VEC];
        load_vec<VEC>(weight + c, w);
#pragma unroll
        for (int e = 0; e < VEC; ++e) y[e] = x[k][e] * r * w[e];
        store_vec<VEC>(out + row * C + c, y);
      }
    }
  }
}

// dweight_partial (G, C) f32: this block's sum over its rows of dout * x * rstd.
template <int VEC, int P, typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_backward_kernel(T* din, float* dweight_partial, const T* dout,
                                        const T* in, const T* weight, const float* rstd, int64_t R,
                                        int64_t C) {
  __shared__ float reduce[32];
  float w[P][VEC], dw[P][VEC];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
#pragma unroll
    for (int e = 0; e < VEC; ++e) { w[k][e] = 0.f; dw[k][e] = 0.f; }
    if (c < C) load_vec<VEC>(weight + c, w[k]);
  }
  for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
    const float r = rstd[row];
    float x[P][VEC], g[P][VEC];
    float dot = 0.f;  // sum_c dout * w * x
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
      if (c < C) {
        load_vec<VEC>(in + row * C + c, x[k]);
        load_vec<VEC>(dout + row * C + c, g[k]);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          dot += g[k][e] * w[k][e] * x[k][e];
          dw[k][e] += g[k][e] * (x[k][e] * r);
        }
      }
    }
    if (din != nullptr) {
      dot = block_sum(dot, reduce);
      const float coef = dot * (r * r * r) / float(C);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
        if (c < C) {
          float d[VEC];
          load_vec<VEC>(din + row * C + c, d);
#pragma unroll
          for (int e = 0; e < VEC; ++e) d[e] += r * w[k][e] * g[k][e] - coef * x[k][e];
          store_vec<VEC>(din + row * C + c, d);
        }
      }
    }
  }
  if (dweight_partial != nullptr) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int64_t c = (int64_t(threadIdx.x) + int64_t(k) * blockDim.x) * VEC;
      if (c < C) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) dweight_partial[int64_t(blockIdx.x) * C + c + e] = dw[k][e];
      }
    }
  }
}


constexpr int kWarps = kThreads / 32;
constexpr int kRowPathMaxChunks = 8;  // per lane: rows up to 32 * 8 * 8 = 2048 elements

// One warp per row; P = chunks of 8 per lane (ceil(C / 256)).
template <int P, typename T>
__global__ void __launch_bounds__(kThreads) rmsnorm_forward_row_kernel(T* out, float* rstd,
                                                                       const T* in, const T* weight,
                                                                       int64_t R, int C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (row >= R) return;  // warp-uniform
  const int chunks = C / 8;
  const T* x_row = in + row * C;
  Raw8<T> raw[P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int c = lane + 32 * k;
    if (c < chunks) load_raw8(x_row + c * 8, raw[k]);
  }
  float sum_sq = 0.f;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int c = lane + 32 * k;
    if (c < chunks) {
      float x[8];
      unpack8(raw[k], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_sq += x[e] * x[e];
    }
  }
  sum_sq = warp_sum(sum_sq);
  const float r = rsqrtf(sum_sq / float(C) + eps);
  if (lane == 0) rstd[row] = r;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int c = lane + 32 * k;
    if (c < chunks) {
      float x[8], w[8], y[8];
      unpack8(raw[k], x);
      load8(weight + c * 8, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = x[e] * r * w[e];
      store8(out + row * C + c * 8, y);
    }
  }
}

// Persistent: block b owns rows (b*kWarps + warp) + i*gridDim.x*kWarps. Dynamic shared memory:
// weight (C) f32, then one dweight accumulator row (C) f32 per warp.
// dweight_partial (gridDim.x, C) f32, or nullptr.
// Resident blocks per SM the backward row kernel is register-capped for: short rows need fewer
// registers, so more rows (bytes) can be in flight.
constexpr int row_backward_min_blocks(int P) { return P <= 2 ? 4 : (P <= 4 ? 3 : 2); }

template <int P, typename T>
__global__ void __launch_bounds__(kThreads, row_backward_min_blocks(P)) rmsnorm_backward_row_kernel(
    T* din, float* dweight_partial, const T* dout, const T* in, const T* weight, const float* rstd,
    int64_t R, int C) {
  extern __shared__ float4 smem4[];
  float* w_s = reinterpret_cast<float*>(smem4);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* dw_s = w_s + C + warp * C;
  const bool want_dw = dweight_partial != nullptr;
  for (int i = threadIdx.x; i < C; i += kThreads) w_s[i] = to_f32(weight[i]);
  if (want_dw)
    for (int i = threadIdx.x; i < kWarps * C; i += kThreads) w_s[C + i] = 0.f;
  __syncthreads();
  const int chunks = C / 8;
  for (int64_t row = blockIdx.x * int64_t(kWarps) + warp; row < R;
       row += int64_t(gridDim.x) * kWarps) {
    const int64_t off = row * C;
    Raw8<T> xr[P], gr[P], dr[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int c = lane + 32 * k;
      if (c < chunks) {
        load_raw8(in + off + c * 8, xr[k]);
        load_raw8(dout + off + c * 8, gr[k]);
        if (din != nullptr) load_raw8(din + off + c * 8, dr[k]);
      }
    }
    const float r = rstd[row];
    float dot = 0.f;  // sum_c dout * w * x
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int c = lane + 32 * k;
      if (c < chunks) {
        float x[8], g[8];
        unpack8(xr[k], x);
        unpack8(gr[k], g);
        const float4* w4 = reinterpret_cast<const float4*>(w_s + c * 8);
        const float4 wa = w4[0], wb = w4[1];
        const float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += g[e] * w[e] * x[e];
        if (want_dw) {
          float4* d4 = reinterpret_cast<float4*>(dw_s + c * 8);
          float4 a = d4[0], b = d4[1];
          a.x += g[0] * (x[0] * r); a.y += g[1] * (x[1] * r);
          a.z += g[2] * (x[2] * r); a.w += g[3] * (x[3] * r);
          b.x += g[4] * (x[4] * r); b.y += g[5] * (x[5] * r);
          b.z += g[6] * (x[6] * r); b.w += g[7] * (x[7] * r);
          d4[0] = a;
          d4[1] = b;
        }
      }
    }
    if (din == nullptr) continue;
    dot = warp_sum(dot);
    const float coef = dot * (r * r * r) / float(C);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int c = lane + 32 * k;
      if (c < chunks) {
        float x[8], g[8], d[8];
        unpack8(xr[k], x);
        unpack8(gr[k], g);
        unpack8(dr[k], d);
        const float4* w4 = reinterpret_cast<const float4*>(w_s + c * 8);
        const float4 wa = w4[0], wb = w4[1];
        const float w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) d[e] += r * w[e] * g[e] - coef * x[e];
        store8(din + off + c * 8, d);
      }
    }
  }
  if (!want_dw) return;
  __syncthreads();
  // This block's partial: the warps' rows added in warp order (fixed).
  for (int i = threadIdx.x; i < C; i += kThreads) {
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += w_s[C + w * C + i];
    dweight_partial[int64_t(blockIdx.x) * C + i] = acc;
  }
}
}  // namespace

// dweight (C) += sum over g < G of partial (G, ld)[:, :C]. Shared with qk_norm and linear.
// Block (32, 32): threadIdx.x picks a column of the block's 32-column tile, threadIdx.y a slice of
// the partial rows (g = y, y + 32, ...); the 32 slice sums are then added in slice order. The
// order depends only on G, so results are bitwise reproducible, and every thread issues only
// G / 32 loads (the old one-thread-per-column loop over all G rows was latency-bound).
constexpr int kReduceSlices = 32;
template <typename TD>
__global__ void __launch_bounds__(32 * kReduceSlices) column_partials_accumulate_kernel(
    TD* dweight, const float* partial, int64_t G, int64_t C, int64_t ld) {
  __shared__ float sums[kReduceSlices][33];
  const int64_t c = blockIdx.x * int64_t(32) + threadIdx.x;
  float acc = 0.f;
  if (c < C) {
#pragma unroll 4
    for (int64_t g = threadIdx.y; g < G; g += kReduceSlices) acc += partial[g * ld + c];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.f;
#pragma unroll
    for (int s = 0; s < kReduceSlices; ++s) total += sums[s][threadIdx.x];
    dweight[c] = from_f32<TD>(to_f32(dweight[c]) + total);
  }
}

void column_partials_accumulate(CudaState& state, Tensor dweight, const float* partial, int64_t G,
                                int64_t C, int64_t ld, const char* op) {
  dispatch_float(dweight.dtype, op, [&](auto tag) {
    using TD = decltype(tag);
    column_partials_accumulate_kernel<TD>
        <<<unsigned(ceil_div(C, 32)), dim3(32, kReduceSlices), 0, state.stream>>>(
            dweight.ptr<TD>(), partial, G, C, ld);
    INGOT_LAUNCH_CHECK("column_partials_accumulate_kernel");
  });
}

namespace {

// Calls f(std::integral_constant<int, VEC>, std::integral_constant<int, P>) for the row length.
template <typename F>
void dispatch_row(int64_t C, bool vector_ok, const char* op, F&& f) {
  const int VEC_ = vector_ok ? 8 : 1;
  const int64_t per_thread = ceil_div(ceil_div(C, VEC_), kThreads);
  auto with_p = [&](auto vec) {
    if (per_thread <= 1) f(vec, std::integral_constant<int, 1>{});
    else if (per_thread <= 2) f(vec, std::integral_constant<int, 2>{});
    else if (per_thread <= 4) f(vec, std::integral_constant<int, 4>{});
    else if (per_thread <= 8) f(vec, std::integral_constant<int, 8>{});
    else fail(op, ": row length ", C, " too long for the RMSNorm kernels");
  };
  if (vector_ok) with_p(std::integral_constant<int, 8>{});
  else with_p(std::integral_constant<int, 1>{});
}

// Calls f(std::integral_constant<int, P>) with P = chunks of 8 per lane for the row path.
template <typename F>
void dispatch_row_chunks(int64_t C, F&& f) {
  const int64_t p = ceil_div(C / 8, 32);
  if (p <= 1) f(std::integral_constant<int, 1>{});
  else if (p <= 2) f(std::integral_constant<int, 2>{});
  else if (p <= 4) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 8>{});
}

bool row_path_ok(int64_t C) { return C % 8 == 0 && C <= 32 * 8 * kRowPathMaxChunks; }

// Resident blocks per SM of the backward row kernel <P, T> at smem bytes of dynamic shared
// memory (fixed for a binary on a GPU); raises the kernel's dynamic shared-memory limit to the
// most any row length of this P needs, once.
template <int P, typename T>
int row_backward_blocks_per_sm(int smem_bytes) {
  static int cached_smem = -1, cached_blocks = 0;
  if (cached_smem != smem_bytes) {
    auto kernel = rmsnorm_backward_row_kernel<P, T>;
    const int max_smem = (1 + kWarps) * 32 * 8 * P * int(sizeof(float));
    INGOT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    int blocks = 0;
    INGOT_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem_bytes));
    cached_smem = smem_bytes;
    cached_blocks = blocks < 1 ? 1 : blocks;
  }
  return cached_blocks;
}

void check_rows(const char* op, const Tensor& in, const Tensor& weight, int64_t* R, int64_t* C) {
  check_tensor(in, op, "in");
  check_tensor(weight, op, "weight");
  check_float(in, op, "in");
  check_dtype(weight, in.dtype, op, "weight");
  *C = weight.numel();
  INGOT_CHECK(*C > 0 && in.dim(-1) == *C, op, ": in ", in.shape_string(), " does not end in C = ", *C);
  *R = in.numel() / *C;
}

}  // namespace

void rmsnorm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor weight, double eps) {
  constexpr const char* op = "rmsnorm_forward";
  CudaState& state = state_of(ctx, op);
  int64_t R = 0, C = 0;
  check_rows(op, in, weight, &R, &C);
  check_tensor(out, op, "out");
  check_tensor(rstd, op, "rstd");
  check_dtype(out, in.dtype, op, "out");
  check_dtype(rstd, DType::f32, op, "rstd");
  check_numel(out, R * C, op, "out");
  check_numel(rstd, R, op, "rstd");
  if (R == 0) return;
  const bool vec = C % 8 == 0 && aligned16(out.data) && aligned16(in.data) && aligned16(weight.data);
  if (vec && row_path_ok(C)) {
    const unsigned rows_grid = static_cast<unsigned>(ceil_div(R, kWarps));
    dispatch_float(in.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      dispatch_row_chunks(C, [&](auto p) {
        rmsnorm_forward_row_kernel<decltype(p)::value, T><<<rows_grid, kThreads, 0, state.stream>>>(
            out.ptr<T>(), rstd.ptr<float>(), in.ptr<T>(), weight.ptr<T>(), R, int(C), float(eps));
        INGOT_LAUNCH_CHECK("rmsnorm_forward_row_kernel");
      });
    });
    return;
  }
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(R, int64_t(state.num_sms) * 16));
  dispatch_float(in.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_row(C, vec, op, [&](auto v, auto p) {
      rmsnorm_forward_kernel<decltype(v)::value, decltype(p)::value, T>
          <<<grid, kThreads, 0, state.stream>>>(out.ptr<T>(), rstd.ptr<float>(), in.ptr<T>(),
                                                weight.ptr<T>(), R, C, float(eps));
      INGOT_LAUNCH_CHECK("rmsnorm_forward_kernel");
    });
  });
}

void rmsnorm_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dout, Tensor in,
                      Tensor weight, Tensor rstd) {
  constexpr const char* op = "rmsnorm_backward";
  CudaState& state = state_of(ctx, op);
  int64_t R = 0, C = 0;
  check_rows(op, in, weight, &R, &C);
  check_tensor(dout, op, "dout");
  check_tensor(rstd, op, "rstd");
  check_dtype(dout, in.dtype, op, "dout");
  check_dtype(rstd, DType::f32, op, "rstd");
  check_numel(dout, R * C, op, "dout");
  check_numel(rstd, R, op, "rstd");
  if (din.present()) {
    check_tensor(din, op, "din");
    check_dtype(din, in.dtype, op, "din");
    check_numel(din, R * C, op, "din");
  }
  if (dweight.present()) {
    check_tensor(dweight, op, "dweight");
    check_float(dweight, op, "dweight");
    check_numel(dweight, C, op, "dweight");
  }
  if (R == 0 || (!din.present() && !dweight.present())) return;
  const bool vec = C % 8 == 0 && aligned16(in.data) && aligned16(dout.data) &&
                   aligned16(weight.data) && (!din.present() || aligned16(din.data));
  if (vec && row_path_ok(C)) {
    const int smem = int((1 + kWarps) * C * int64_t(sizeof(float)));
    dispatch_float(in.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      dispatch_row_chunks(C, [&](auto p) {
        constexpr int P = decltype(p)::value;
        const int per_sm = row_backward_blocks_per_sm<P, T>(smem);
        const int64_t G = std::min<int64_t>(ceil_div(R, kWarps), int64_t(state.num_sms) * per_sm);
        float* partial = dweight.present() ? static_cast<float*>(scratch_buffer(
                                                 state, G * C * int64_t(sizeof(float)), op))
                                           : nullptr;
        rmsnorm_backward_row_kernel<P, T><<<unsigned(G), kThreads, smem, state.stream>>>(
            din.present() ? din.ptr<T>() : nullptr, partial, dout.ptr<T>(), in.ptr<T>(),
            weight.ptr<T>(), rstd.ptr<float>(), R, int(C));
        INGOT_LAUNCH_CHECK("rmsnorm_backward_row_kernel");
        if (dweight.present()) column_partials_accumulate(state, dweight, partial, G, C, C, op);
      });
    });
    return;
  }
  // Two blocks per SM: enough rows in flight to hide latency, few partial rows to reduce.
  const int64_t G = std::min<int64_t>(R, int64_t(state.num_sms) * 2);
  float* partial = dweight.present()
                       ? static_cast<float*>(scratch_buffer(state, G * C * int64_t(sizeof(float)), op))
                       : nullptr;
  dispatch_float(in.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_row(C, vec, op, [&](auto v, auto p) {
      rmsnorm_backward_kernel<decltype(v)::value, decltype(p)::value, T>
          <<<unsigned(G), kThreads, 0, state.stream>>>(din.present() ? din.ptr<T>() : nullptr,
                                                       partial, dout.ptr<T>(), in.ptr<T>(),
                                                       weight.ptr<T>(), rstd.ptr<float>(), R, C);
      INGOT_LAUNCH_CHECK("rmsnorm_backward_kernel");
    });
  });
  if (dweight.present()) column_partials_accumulate(state, dweight, partial, G, C, C, op);
}

}  // namespace ingot::cuda
