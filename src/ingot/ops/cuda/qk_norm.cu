// Qwen3 per-head RMSNorm of q and k inside packed qkv (N,Htot,D), Htot = Hq + 2*Hkv; v heads pass
// through. rstd (N, Hq+Hkv) f32.
// Invariants:
//   - Vector path (D % 8 == 0, 16-byte aligned tensors): a row (token, head) of D elements is
//     D/8 16-byte chunks, one per lane of an aligned group of L = pow2ceil(D/8) lanes (shuffle
//     reductions stay inside the group); each thread handles U rows per step with all their loads
//     issued first.
//   - Scalar fallback: one warp per row; lane owns d = lane + 32k (k < P, D <= 256).
//   - Backward: din OVERWRITES. dq_weight/dk_weight accumulate deterministically: a fixed set of
//     persistent blocks (vector path) or warps (fallback), fixed by N and the SM count, each sums
//     its rows in a fixed order into an f32 partial (G, 2D) (vector path: the block's threads are
//     added in thread order); column_partials_accumulate then adds the G partials in order.
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;

template <int P, typename T>
__global__ void __launch_bounds__(kThreads) qk_norm_forward_kernel(T* out, float* rstd, const T* in, const T* q_weight,
                                       const T* k_weight, int64_t N, int Hq, int Hkv, int D,
                                       float eps) {
  const int lane = threadIdx.x & 31;
  const int Htot = Hq + 2 * Hkv, Hn = Hq + Hkv;
  const int64_t rows = N * Htot;
  for (int64_t row = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5); row < rows;
       row += int64_t(gridDim.x) * kWarps) {
    const int64_t n = row / Htot;
    const int h = int(row % Htot);
    const T* x_row = in + row * D;
    T* y_row = out + row * D;
    if (h >= Hn) {  // v head: copied through
      for (int d = lane; d < D; d += 32) y_row[d] = x_row[d];
      continue;
    }
    const T* w = h < Hq ? q_weight : k_weight;
    float x[P];
    float sum_sq = 0.f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      x[k] = d < D ? to_f32(x_row[d]) : 0.f;
      sum_sq += x[k] * x[k];
    }
    sum_sq = warp_sum(sum_sq);
    const float r = rsqrtf(sum_sq / float(D) + eps);
    if (lane == 0) rstd[n * Hn + h] = r;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      if (d < D) y_row[d] = from_f32<T>(x[k] * r * to_f32(w[d]));
    }
  }
}

// partial (GW, 2D): [gw][0,D) q-weight sums, [gw][D,2D) k-weight sums.
template <int P, typename T>
__global__ void __launch_bounds__(kThreads) qk_norm_backward_kernel(T* din, float* partial, const T* dout, const T* in,
                                        const T* q_weight, const T* k_weight, const float* rstd,
                                        int64_t N, int Hq, int Hkv, int D) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  const int64_t GW = int64_t(gridDim.x) * kWarps;
  const int Htot = Hq + 2 * Hkv, Hn = Hq + Hkv;
  float wq[P], wk[P], dwq[P], dwk[P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int d = lane + 32 * k;
    wq[k] = d < D ? to_f32(q_weight[d]) : 0.f;
    wk[k] = d < D ? to_f32(k_weight[d]) : 0.f;
    dwq[k] = 0.f;
    dwk[k] = 0.f;
  }
  for (int64_t n = gw; n < N; n += GW) {
    for (int h = 0; h < Htot; ++h) {
      const int64_t off = (n * Htot + h) * D;
      if (h >= Hn) {
        if (din != nullptr)
          for (int d = lane; d < D; d += 32) din[off + d] = dout[off + d];
        continue;
      }
      const bool is_q = h < Hq;
      const float r = rstd[n * Hn + h];
      float x[P], g[P];
      float dot = 0.f;
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const int d = lane + 32 * k;
        x[k] = d < D ? to_f32(in[off + d]) : 0.f;
        g[k] = d < D ? to_f32(dout[off + d]) : 0.f;
        const float w = is_q ? wq[k] : wk[k];
        dot += g[k] * w * x[k];
        if (is_q) dwq[k] += g[k] * (x[k] * r);
        else dwk[k] += g[k] * (x[k] * r);
      }
      if (din == nullptr) continue;
      dot = warp_sum(dot);
      const float coef = dot * (r * r * r) / float(D);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const int d = lane + 32 * k;
        const float w = is_q ? wq[k] : wk[k];
        if (d < D) din[off + d] = from_f32<T>(r * w * g[k] - coef * x[k]);
      }
    }
  }
  if (partial != nullptr) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int d = lane + 32 * k;
      if (d < D) {
        partial[gw * 2 * D + d] = dwq[k];
        partial[gw * 2 * D + D + d] = dwk[k];
      }
    }
  }
}


// ---- vector path ----------------------------------------------------------------------------
constexpr int kRowsPerThread = 2;  // U
constexpr int kBackwardBlocksPerSm = 3;  // launch bound of the backward: <= 85 registers, no spills

// L lanes per row (power of two >= D/8), U rows per thread. Non-persistent grid.
template <int L, typename T>
__global__ void __launch_bounds__(kThreads) qk_norm_forward_vec_kernel(
    T* out, float* rstd, const T* in, const T* q_weight, const T* k_weight, int64_t N, int Hq,
    int Hkv, int D, float eps) {
  constexpr int kRowsPerBlockStep = kThreads / L;
  constexpr int U = kRowsPerThread;
  const int j = threadIdx.x & (L - 1), chunks = D / 8;
  const int Htot = Hq + 2 * Hkv, Hn = Hq + Hkv;
  const int64_t rows = N * Htot;
  const int64_t row0 = blockIdx.x * int64_t(kRowsPerBlockStep * U) + threadIdx.x / L;
  Raw8<T> raw[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t row = row0 + u * kRowsPerBlockStep;
    if (row < rows && j < chunks) load_raw8(in + row * D + j * 8, raw[u]);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t row = row0 + u * kRowsPerBlockStep;
    const bool valid = row < rows && j < chunks;
    float x[8];
    float sum_sq = 0.f;
    if (valid) {
      unpack8(raw[u], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_sq += x[e] * x[e];
    }
    sum_sq = group_sum<L>(sum_sq);  // every lane takes part
    if (!valid) continue;
    const int64_t n = row / Htot;
    const int h = int(row - n * Htot);
    if (h >= Hn) {  // v head: copied through
      store_raw8(out + row * D + j * 8, raw[u]);
      continue;
    }
    const float r = rsqrtf(sum_sq / float(D) + eps);
    if (j == 0) rstd[n * Hn + h] = r;
    float w[8], y[8];
    load8((h < Hq ? q_weight : k_weight) + j * 8, w);
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = x[e] * r * w[e];
    store8(out + row * D + j * 8, y);
  }
}

// Persistent grid; block b handles row steps b, b + gridDim.x, ... of kRowsPerBlockStep * U rows.
// partial (gridDim.x, 2D): [b][0,D) q-weight sums, [b][D,2D) k-weight sums; or nullptr.
template <int L, typename T>
__global__ void __launch_bounds__(kThreads, kBackwardBlocksPerSm) qk_norm_backward_vec_kernel(
    T* din, float* partial, const T* dout, const T* in, const T* q_weight, const T* k_weight,
    const float* rstd, int64_t N, int Hq, int Hkv, int D) {
  constexpr int kRowsPerBlockStep = kThreads / L;
  constexpr int U = kRowsPerThread;
  __shared__ float4 sums4[kThreads * 4];  // 16 floats per thread: dwq[8], dwk[8]
  const int j = threadIdx.x & (L - 1), slot = threadIdx.x / L, chunks = D / 8;
  const int Htot = Hq + 2 * Hkv, Hn = Hq + Hkv;
  const int64_t rows = N * Htot;
  __shared__ float4 weights4[2 * 256 / 4];  // [q_weight | k_weight] in f32 (D <= 256)
  float* w_s = reinterpret_cast<float*>(weights4);
  const bool lane_on = j < chunks;
  for (int i = threadIdx.x; i < D; i += kThreads) {
    w_s[i] = to_f32(q_weight[i]);
    w_s[D + i] = to_f32(k_weight[i]);
  }
  float dwq[8], dwk[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    dwq[e] = 0.f;
    dwk[e] = 0.f;
  }
  __syncthreads();
  for (int64_t base = blockIdx.x * int64_t(kRowsPerBlockStep * U); base < rows;
       base += int64_t(gridDim.x) * kRowsPerBlockStep * U) {
    Raw8<T> xr[U], gr[U];
    float r[U];
    int kind[U];  // 0 q, 1 k, 2 v, 3 outside
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = base + u * kRowsPerBlockStep + slot;
      kind[u] = 3;
      r[u] = 0.f;
      if (row < rows) {
        const int64_t n = row / Htot;
        const int h = int(row - n * Htot);
        kind[u] = h < Hq ? 0 : (h < Hn ? 1 : 2);
        if (lane_on) {
          load_raw8(dout + row * D + j * 8, gr[u]);
          if (kind[u] < 2) load_raw8(in + row * D + j * 8, xr[u]);
        }
        if (kind[u] < 2) r[u] = rstd[n * Hn + h];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t row = base + u * kRowsPerBlockStep + slot;
      const bool norm = lane_on && kind[u] < 2;
      float x[8], g[8], w[8];
      float dot = 0.f;  // sum_d dout * w * x
      if (norm) {
        unpack8(xr[u], x);
        unpack8(gr[u], g);
        const float4* w4 = reinterpret_cast<const float4*>(w_s + kind[u] * D + j * 8);
        const float4 wa = w4[0], wb = w4[1];
        w[0] = wa.x; w[1] = wa.y; w[2] = wa.z; w[3] = wa.w;
        w[4] = wb.x; w[5] = wb.y; w[6] = wb.z; w[7] = wb.w;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += g[e] * w[e] * x[e];
      }
      dot = group_sum<L>(dot);  // every lane takes part
      if (!lane_on || kind[u] == 3) continue;
      if (kind[u] == 2) {  // v head: din = dout
        if (din != nullptr) store_raw8(din + row * D + j * 8, gr[u]);
        continue;
      }
      const float rr = r[u];
      if (kind[u] == 0) {
#pragma unroll
        for (int e = 0; e < 8; ++e) dwq[e] += g[e] * (x[e] * rr);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dwk[e] += g[e] * (x[e] * rr);
      }
      if (din == nullptr) continue;
      const float coef = dot * (rr * rr * rr) / float(D);
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = rr * w[e] * g[e] - coef * x[e];
      store8(din + row * D + j * 8, y);
    }
  }
  if (partial == nullptr) return;
  float* sums = reinterpret_cast<float*>(sums4);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    sums[threadIdx.x * 16 + e] = dwq[e];
    sums[threadIdx.x * 16 + 8 + e] = dwk[e];
  }
  __syncthreads();
  // Column i of [q | k]: the block's kRowsPerBlockStep slots added in slot order (fixed).
  for (int i = threadIdx.x; i < 2 * D; i += kThreads) {
    const int which = i >= D ? 1 : 0, d = i - which * D;
    float acc = 0.f;
    for (int s = 0; s < kRowsPerBlockStep; ++s)
      acc += sums[(s * L + d / 8) * 16 + which * 8 + (d & 7)];
    partial[int64_t(blockIdx.x) * 2 * D + i] = acc;
  }
}

// Calls f(std::integral_constant<int, L>) with L = pow2ceil(D / 8) lanes per row.
template <typename F>
void dispatch_lanes(int D, F&& f) {
  const int chunks = D / 8;
  if (chunks <= 1) f(std::integral_constant<int, 1>{});
  else if (chunks <= 2) f(std::integral_constant<int, 2>{});
  else if (chunks <= 4) f(std::integral_constant<int, 4>{});
  else if (chunks <= 8) f(std::integral_constant<int, 8>{});
  else if (chunks <= 16) f(std::integral_constant<int, 16>{});
  else f(std::integral_constant<int, 32>{});
}

struct QkShape {
  int64_t N;
  int Hq, Hkv, D;
};

QkShape qk_shape(const char* op, const Tensor& in, const Tensor& q_weight, const Tensor& k_weight,
                 int n_q_heads, int n_kv_heads) {
  check_tensor(in, op, "in");
  check_tensor(q_weight, op, "q_weight");
  check_tensor(k_weight, op, "k_weight");
  check_float(in, op, "in");
  check_dtype(q_weight, in.dtype, op, "q_weight");
  check_dtype(k_weight, in.dtype, op, "k_weight");
  INGOT_CHECK(in.ndim >= 3, op, ": in must be (N,Htot,D), got ", in.shape_string());
  const int64_t Htot = in.dim(-2), D = in.dim(-1);
  INGOT_CHECK(n_q_heads > 0 && n_kv_heads > 0 && Htot == n_q_heads + 2 * int64_t(n_kv_heads), op,
              ": in ", in.shape_string(), " has ", Htot, " heads, expected Hq + 2*Hkv = ",
              n_q_heads + 2 * int64_t(n_kv_heads));
  INGOT_CHECK(D > 0 && D <= 256, op, ": head dim ", D, " outside (0, 256]");
  check_numel(q_weight, D, op, "q_weight");
  check_numel(k_weight, D, op, "k_weight");
  return {in.numel() / (Htot * D), n_q_heads, n_kv_heads, int(D)};
}

template <typename F>
void dispatch_head_dim(int D, F&& f) {
  if (D <= 32) f(std::integral_constant<int, 1>{});
  else if (D <= 64) f(std::integral_constant<int, 2>{});
  else if (D <= 128) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 8>{});
}

}  // namespace

void qk_norm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor q_weight,
                     Tensor k_weight, int n_q_heads, int n_kv_heads, double eps) {
  constexpr const char* op = "qk_norm_forward";
  CudaState& state = state_of(ctx, op);
  const QkShape s = qk_shape(op, in, q_weight, k_weight, n_q_heads, n_kv_heads);
  check_tensor(out, op, "out");
  check_tensor(rstd, op, "rstd");
  check_dtype(out, in.dtype, op, "out");
  check_dtype(rstd, DType::f32, op, "rstd");
  check_numel(out, in.numel(), op, "out");
  check_numel(rstd, s.N * (s.Hq + s.Hkv), op, "rstd");
  if (s.N == 0) return;
  const int64_t rows = s.N * (s.Hq + 2 * s.Hkv);
  if (s.D % 8 == 0 && aligned16(out.data) && aligned16(in.data) && aligned16(q_weight.data) &&
      aligned16(k_weight.data)) {
    dispatch_float(in.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      dispatch_lanes(s.D, [&](auto l) {
        constexpr int L = decltype(l)::value;
        const unsigned vgrid = unsigned(ceil_div(rows, int64_t(kThreads / L) * kRowsPerThread));
        qk_norm_forward_vec_kernel<L, T><<<vgrid, kThreads, 0, state.stream>>>(
            out.ptr<T>(), rstd.ptr<float>(), in.ptr<T>(), q_weight.ptr<T>(), k_weight.ptr<T>(),
            s.N, s.Hq, s.Hkv, s.D, float(eps));
        INGOT_LAUNCH_CHECK("qk_norm_forward_vec_kernel");
      });
    });
    return;
  }
  const unsigned grid = grid_for(rows, kWarps, state);
  dispatch_float(in.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_head_dim(s.D, [&](auto p) {
      qk_norm_forward_kernel<decltype(p)::value, T><<<grid, kThreads, 0, state.stream>>>(
          out.ptr<T>(), rstd.ptr<float>(), in.ptr<T>(), q_weight.ptr<T>(), k_weight.ptr<T>(), s.N,
          s.Hq, s.Hkv, s.D, float(eps));
      INGOT_LAUNCH_CHECK("qk_norm_forward_kernel");
    });
  });
}

void qk_norm_backward(Context& ctx, Tensor din, Tensor dq_weight, Tensor dk_weight, Tensor dout,
                      Tensor in, Tensor q_weight, Tensor k_weight, Tensor rstd, int n_q_heads,
                      int n_kv_heads) {
  constexpr const char* op = "qk_norm_backward";
  CudaState& state = state_of(ctx, op);
  const QkShape s = qk_shape(op, in, q_weight, k_weight, n_q_heads, n_kv_heads);
  check_tensor(dout, op, "dout");
  check_tensor(rstd, op, "rstd");
  check_dtype(dout, in.dtype, op, "dout");
  check_dtype(rstd, DType::f32, op, "rstd");
  check_numel(dout, in.numel(), op, "dout");
  check_numel(rstd, s.N * (s.Hq + s.Hkv), op, "rstd");
  if (din.present()) {
    check_tensor(din, op, "din");
    check_dtype(din, in.dtype, op, "din");
    check_numel(din, in.numel(), op, "din");
  }
  for (const Tensor* dw : {&dq_weight, &dk_weight}) {
    if (!dw->present()) continue;
    check_tensor(*dw, op, "dq_weight/dk_weight");
    check_float(*dw, op, "dq_weight/dk_weight");
    check_numel(*dw, s.D, op, "dq_weight/dk_weight");
  }
  const bool want_weights = dq_weight.present() || dk_weight.present();
  if (s.N == 0 || (!din.present() && !want_weights)) return;
  if (s.D % 8 == 0 && aligned16(in.data) && aligned16(dout.data) &&
      (!din.present() || aligned16(din.data))) {
    const int64_t rows = s.N * (s.Hq + 2 * s.Hkv);
    dispatch_float(in.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      dispatch_lanes(s.D, [&](auto l) {
        constexpr int L = decltype(l)::value;
        // Blocks per SM as the kernel's launch bound, no more than there are row steps.
        const int64_t G = std::min<int64_t>(ceil_div(rows, int64_t(kThreads / L) * kRowsPerThread),
                                            int64_t(state.num_sms) * kBackwardBlocksPerSm);
        float* partial = want_weights ? static_cast<float*>(scratch_buffer(
                                            state, G * 2 * s.D * int64_t(sizeof(float)), op))
                                      : nullptr;
        qk_norm_backward_vec_kernel<L, T><<<unsigned(G), kThreads, 0, state.stream>>>(
            din.present() ? din.ptr<T>() : nullptr, partial, dout.ptr<T>(), in.ptr<T>(),
            q_weight.ptr<T>(), k_weight.ptr<T>(), rstd.ptr<float>(), s.N, s.Hq, s.Hkv, s.D);
        INGOT_LAUNCH_CHECK("qk_norm_backward_vec_kernel");
        if (dq_weight.present())
          column_partials_accumulate(state, dq_weight, partial, G, s.D, 2 * s.D, op);
        if (dk_weight.present())
          column_partials_accumulate(state, dk_weight, partial + s.D, G, s.D, 2 * s.D, op);
      });
    });
    return;
  }
  // Warps: four blocks of 8 per SM, at most one per token.
  const int64_t blocks = std::min<int64_t>(ceil_div(s.N, kWarps), int64_t(state.num_sms) * 4);
  const int64_t GW = blocks * kWarps;
  float* partial = want_weights ? static_cast<float*>(scratch_buffer(
                                      state, GW * 2 * s.D * int64_t(sizeof(float)), op))
                                : nullptr;
  dispatch_float(in.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_head_dim(s.D, [&](auto p) {
      qk_norm_backward_kernel<decltype(p)::value, T><<<unsigned(blocks), kThreads, 0, state.stream>>>(
          din.present() ? din.ptr<T>() : nullptr, partial, dout.ptr<T>(), in.ptr<T>(),
          q_weight.ptr<T>(), k_weight.ptr<T>(), rstd.ptr<float>(), s.N, s.Hq, s.Hkv, s.D);
      INGOT_LAUNCH_CHECK("qk_norm_backward_kernel");
    });
  });
  if (!want_weights) return;
  // Partial rows are (q | k) halves of 2D floats: reduce each half with a row stride of 2D.
  if (dq_weight.present()) column_partials_accumulate(state, dq_weight, partial, GW, s.D, 2 * s.D, op);
  if (dk_weight.present())
    column_partials_accumulate(state, dk_weight, partial + s.D, GW, s.D, 2 * s.D, op);
}

}  // namespace ingot::cuda
