// Causal GQA attention backward: dqkv (B,T,Htot,D) overwrite, from dout (B,T,Hq,D), out, lse
// (B,Hq,T) and qkv. Tiling and thread layout: attention_common.cuh.
// Three kernels, deterministic (no atomics):
//   1. delta (B,Hq,T) f32 = rowsum(dout * out), one warp per row;
//   2. dk/dv: one block per (key tile, kv head, batch) loops over the query heads of its group and
//      the query tiles at or below the diagonal, recomputing P = exp(scale*QK^T - lse) and
//      dS = P * (dP - delta), dP = dO V^T; accumulates dV += P^T dO and dK += scale * dS^T Q in
//      registers;
//   3. dq: one block per (query tile, query head, batch) loops over key tiles up to the diagonal,
//      recomputing P and dS, and accumulates dQ += scale * dS K.
// Recomputing S in two kernels costs 7 tile GEMMs instead of 5, the price of determinism without
// atomics on dQ.
#include <cmath>

#include "ingot/ops/cuda/attention_common.cuh"
#include "ingot/ops/cuda/attention_cudnn.h"
#include "ingot/ops/cuda/attention_mma.h"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

using namespace attention;

// For one (query tile, key tile) pair with Q, dO, K, V staged: this thread's 4 x 4 entries of
// P (probabilities) and dS (score gradients, before the softmax scale), stored to P_s and dS_s
// (BQ, BK+1). Rows are queries, columns keys.
__device__ __forceinline__ void probabilities_and_score_grads(
    float* P_s, float* dS_s, const float* Qs, const float* dOs, const float* Ks, const float* Vs,
    const float* lse_s, const float* delta_s, const int* seg_q, const int* seg_k, int q0, int k0,
    int T_len, int D, float scale) {
  const int DP = D + 1;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float s_acc[4][4], dp_acc[4][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int c = 0; c < 4; ++c) { s_acc[a][c] = 0.f; dp_acc[a][c] = 0.f; }
  for (int d = 0; d < D; ++d) {
    float qa[4], ga[4], kc[4], vc[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      qa[a] = Qs[(ty * 4 + a) * DP + d];
      ga[a] = dOs[(ty * 4 + a) * DP + d];
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      kc[c] = Ks[(tx + 16 * c) * DP + d];
      vc[c] = Vs[(tx + 16 * c) * DP + d];
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s_acc[a][c] += qa[a] * kc[c];
        dp_acc[a][c] += ga[a] * vc[c];
      }
  }
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = ty * 4 + a, col = tx + 16 * c;
      const bool ok = attends(q0 + r, k0 + col, T_len, seg_q[r], seg_k[col]);
      const float p = ok ? expf(s_acc[a][c] * scale - lse_s[r]) : 0.f;
      P_s[r * (kBlockK + 1) + col] = p;
      dS_s[r * (kBlockK + 1) + col] = p * (dp_acc[a][c] - delta_s[r]);
    }
}

// Loads lse, delta and segment ids of query rows [q0, q0 + BQ) of head h.
__device__ __forceinline__ void load_row_stats(float* lse_s, float* delta_s, int* seg_q,
                                               const float* lse, const float* delta,
                                               const int32_t* seg, int64_t stat_base, int q0,
                                               int T_len) {
  for (int r = threadIdx.x; r < kBlockQ; r += blockDim.x) {
    const int i = q0 + r;
    const bool in = i < T_len;
    lse_s[r] = in ? lse[stat_base + i] : 0.f;
    delta_s[r] = in ? delta[stat_base + i] : 0.f;
    seg_q[r] = seg && in ? seg[i] : 0;
  }
}

struct BackwardSmem {
  float *Ks, *Vs, *Qs, *dOs, *P_s, *dS_s, *lse_s, *delta_s;
  int *seg_q, *seg_k;
};

__device__ __forceinline__ BackwardSmem carve(float* smem, int D) {
  const int DP = D + 1;
  BackwardSmem m;
  m.Ks = smem;
  m.Vs = m.Ks + kBlockK * DP;
  m.Qs = m.Vs + kBlockK * DP;
  m.dOs = m.Qs + kBlockQ * DP;
  m.P_s = m.dOs + kBlockQ * DP;
  m.dS_s = m.P_s + kBlockQ * (kBlockK + 1);
  m.lse_s = m.dS_s + kBlockQ * (kBlockK + 1);
  m.delta_s = m.lse_s + kBlockQ;
  m.seg_q = reinterpret_cast<int*>(m.delta_s + kBlockQ);
  m.seg_k = m.seg_q + kBlockQ;
  return m;
}

template <int DMAX, typename T>
__global__ void __launch_bounds__(kThreads) attention_backward_dkdv_kernel(T* dqkv, const T* dout, const float* lse,
                                               const float* delta, const T* qkv,
                                               const int32_t* segment_ids, Shape s, float scale) {
  extern __shared__ float smem[];
  constexpr int J = DMAX / 16;
  const int D = s.D, DP = D + 1, T_len = s.T, Htot = s.Htot();
  const BackwardSmem m = carve(smem, D);
  const int k0 = blockIdx.x * kBlockK, g = blockIdx.y, b = blockIdx.z;
  const int group = s.Hq / s.Hkv;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t row_stride = int64_t(Htot) * D;
  const T* batch = qkv + int64_t(b) * T_len * row_stride;
  const T* dout_batch = dout + int64_t(b) * T_len * s.Hq * D;
  const int32_t* seg = segment_ids ? segment_ids + int64_t(b) * T_len : nullptr;

  load_tile(m.Ks, batch + int64_t(s.Hq + g) * D, row_stride, k0, kBlockK, T_len, D);
  load_tile(m.Vs, batch + int64_t(s.Hq + s.Hkv + g) * D, row_stride, k0, kBlockK, T_len, D);
  for (int r = threadIdx.x; r < kBlockK; r += blockDim.x) m.seg_k[r] = seg && k0 + r < T_len ? seg[k0 + r] : 0;

  float dk[4][J], dv[4][J];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int j = 0; j < J; ++j) { dk[a][j] = 0.f; dv[a][j] = 0.f; }

  const int first_q = (k0 / kBlockQ) * kBlockQ;  // query tiles entirely above the diagonal skipped
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const int64_t stat_base = (int64_t(b) * s.Hq + h) * T_len;
    for (int q0 = first_q; q0 < T_len; q0 += kBlockQ) {
      __syncthreads();  // the previous tile's P, dS, Q, dO are no longer read
      load_tile(m.Qs, batch + int64_t(h) * D, row_stride, q0, kBlockQ, T_len, D);
      load_tile(m.dOs, dout_batch + int64_t(h) * D, int64_t(s.Hq) * D, q0, kBlockQ, T_len, D);
      load_row_stats(m.lse_s, m.delta_s, m.seg_q, lse, delta, seg, stat_base, q0, T_len);
      __syncthreads();
      probabilities_and_score_grads(m.P_s, m.dS_s, m.Qs, m.dOs, m.Ks, m.Vs, m.lse_s, m.delta_s,
                                    m.seg_q, m.seg_k, q0, k0, T_len, D, scale);
      __syncthreads();
      // dV[k][d] += sum_q P[q][k] dO[q][d];  dK[k][d] += sum_q dS[q][k] Q[q][d]
      for (int q = 0; q < kBlockQ; ++q) {
        float p[4], ds[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          p[a] = m.P_s[q * (kBlockK + 1) + ty * 4 + a];
          ds[a] = m.dS_s[q * (kBlockK + 1) + ty * 4 + a];
        }
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int d = tx + 16 * j;
          const float go = d < D ? m.dOs[q * DP + d] : 0.f;
          const float qv = d < D ? m.Qs[q * DP + d] : 0.f;
#pragma unroll
          for (int a = 0; a < 4; ++a) {
            dv[a][j] += p[a] * go;
            dk[a][j] += ds[a] * qv;
          }
        }
      }
    }
  }

  T* dk_base = dqkv + int64_t(b) * T_len * row_stride + int64_t(s.Hq + g) * D;
  T* dv_base = dqkv + int64_t(b) * T_len * row_stride + int64_t(s.Hq + s.Hkv + g) * D;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int j_row = k0 + ty * 4 + a;
    if (j_row >= T_len) continue;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int d = tx + 16 * j;
      if (d >= D) continue;
      dk_base[int64_t(j_row) * row_stride + d] = from_f32<T>(dk[a][j] * scale);
      dv_base[int64_t(j_row) * row_stride + d] = from_f32<T>(dv[a][j]);
    }
  }
}

template <int DMAX, typename T>
__global__ void __launch_bounds__(kThreads) attention_backward_dq_kernel(T* dqkv, const T* dout, const float* lse,
                                             const float* delta, const T* qkv,
                                             const int32_t* segment_ids, Shape s, float scale) {
  extern __shared__ float smem[];
  constexpr int J = DMAX / 16;
  const int D = s.D, DP = D + 1, T_len = s.T, Htot = s.Htot();
  const BackwardSmem m = carve(smem, D);
  const int q0 = blockIdx.x * kBlockQ, h = blockIdx.y, b = blockIdx.z;
  const int g = h / (s.Hq / s.Hkv);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t row_stride = int64_t(Htot) * D;
  const T* batch = qkv + int64_t(b) * T_len * row_stride;
  const int32_t* seg = segment_ids ? segment_ids + int64_t(b) * T_len : nullptr;
  const int64_t stat_base = (int64_t(b) * s.Hq + h) * T_len;

  load_tile(m.Qs, batch + int64_t(h) * D, row_stride, q0, kBlockQ, T_len, D);
  load_tile(m.dOs, dout + int64_t(b) * T_len * s.Hq * D + int64_t(h) * D, int64_t(s.Hq) * D, q0,
            kBlockQ, T_len, D);
  load_row_stats(m.lse_s, m.delta_s, m.seg_q, lse, delta, seg, stat_base, q0, T_len);

  float dq[4][J];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int j = 0; j < J; ++j) dq[a][j] = 0.f;

  const int last_key = min(T_len - 1, q0 + kBlockQ - 1);
  for (int k0 = 0; k0 <= last_key; k0 += kBlockK) {
    __syncthreads();  // the previous tile's K, dS are no longer read
    load_tile(m.Ks, batch + int64_t(s.Hq + g) * D, row_stride, k0, kBlockK, T_len, D);
    load_tile(m.Vs, batch + int64_t(s.Hq + s.Hkv + g) * D, row_stride, k0, kBlockK, T_len, D);
    for (int r = threadIdx.x; r < kBlockK; r += blockDim.x) m.seg_k[r] = seg && k0 + r < T_len ? seg[k0 + r] : 0;
    __syncthreads();
    probabilities_and_score_grads(m.P_s, m.dS_s, m.Qs, m.dOs, m.Ks, m.Vs, m.lse_s, m.delta_s,
                                  m.seg_q, m.seg_k, q0, k0, T_len, D, scale);
    __syncthreads();
    // dQ[q][d] += sum_k dS[q][k] K[k][d]
    for (int k = 0; k < kBlockK; ++k) {
      float ds[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) ds[a] = m.dS_s[(ty * 4 + a) * (kBlockK + 1) + k];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int d = tx + 16 * j;
        const float kv = d < D ? m.Ks[k * DP + d] : 0.f;
#pragma unroll
        for (int a = 0; a < 4; ++a) dq[a][j] += ds[a] * kv;
      }
    }
  }

  T* dq_base = dqkv + int64_t(b) * T_len * row_stride + int64_t(h) * D;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int i = q0 + ty * 4 + a;
    if (i >= T_len) continue;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int d = tx + 16 * j;
      if (d < D) dq_base[int64_t(i) * row_stride + d] = from_f32<T>(dq[a][j] * scale);
    }
  }
}

}  // namespace

void attention_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                        Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                        double scale) {
  constexpr const char* op = "attention_backward";
  CudaState& state = state_of(ctx, op);
  for (auto [t, name] : {std::pair{&dqkv, "dqkv"}, {&dout, "dout"}, {&out, "out"}, {&lse, "lse"}, {&qkv, "qkv"}})
    check_tensor(*t, op, name);
  check_float(qkv, op, "qkv");
  check_dtype(dqkv, qkv.dtype, op, "dqkv");
  check_dtype(dout, qkv.dtype, op, "dout");
  check_dtype(out, qkv.dtype, op, "out");
  check_dtype(lse, DType::f32, op, "lse");
  INGOT_CHECK(qkv.ndim == 4, op, ": qkv must be (B,T,Htot,D), got ", qkv.shape_string());
  INGOT_CHECK(n_q_heads > 0 && n_kv_heads > 0 && n_q_heads % n_kv_heads == 0, op, ": Hq ",
              n_q_heads, " must be a positive multiple of Hkv ", n_kv_heads);
  const Shape s{int(qkv.dim(0)), int(qkv.dim(1)), n_q_heads, n_kv_heads, int(qkv.dim(3))};
  INGOT_CHECK(qkv.dim(2) == s.Htot(), op, ": qkv ", qkv.shape_string(), " has ", qkv.dim(2),
              " heads, expected Hq + 2*Hkv = ", s.Htot());
  check_numel(dqkv, qkv.numel(), op, "dqkv");
  check_numel(out, int64_t(s.B) * s.T * s.Hq * s.D, op, "out");
  check_numel(dout, int64_t(s.B) * s.T * s.Hq * s.D, op, "dout");
  check_numel(lse, int64_t(s.B) * s.Hq * s.T, op, "lse");
  if (segment_ids.present()) {
    check_tensor(segment_ids, op, "segment_ids");
    check_dtype(segment_ids, DType::i32, op, "segment_ids");
    check_numel(segment_ids, int64_t(s.B) * s.T, op, "segment_ids");
  }
  if (s.B == 0 || s.T == 0) return;
  // cuDNN's fused flash attention where it applies (attention_cudnn.h), then Ingot's tensor-core
  // kernels (attention_mma.h), else the CUDA-core kernels below.
  if (attention_cudnn_backward(ctx, dqkv, dout, out, lse, qkv, segment_ids, n_q_heads, n_kv_heads,
                               scale))
    return;
  if (attention_mma_backward(ctx, dqkv, dout, out, lse, qkv, segment_ids, n_q_heads, n_kv_heads, scale))
    return;
  attention_set_last_path("kernels");
  INGOT_CHECK(s.D % 8 != 0 || (aligned16(qkv.data) && aligned16(dout.data)), op,
              ": qkv and dout must be 16-byte aligned");
  const int64_t rows = int64_t(s.B) * s.Hq * s.T;
  float* delta = static_cast<float*>(scratch_buffer(state, rows * int64_t(sizeof(float)), op));
  const size_t smem = backward_smem_bytes(s.D);
  check_kernels_fit(s.D, smem, state.max_smem_per_block, op);
  const int32_t* seg = segment_ids.present() ? segment_ids.ptr<int32_t>() : nullptr;
  dispatch_float(qkv.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    attention::attention_delta_kernel<T><<<grid_for(rows * 32, 256, state), 256, 0, state.stream>>>(
        delta, dout.ptr<T>(), out.ptr<T>(), s);
    INGOT_LAUNCH_CHECK("attention_delta_kernel");
    dispatch_head_dim(s.D, op, [&](auto dmax) {
      constexpr int DMAX = decltype(dmax)::value;
      auto dkdv = attention_backward_dkdv_kernel<DMAX, T>;
      INGOT_CUDA_CHECK(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      dkdv<<<dim3(unsigned(ceil_div(s.T, kBlockK)), unsigned(s.Hkv), unsigned(s.B)), kThreads, smem,
             state.stream>>>(dqkv.ptr<T>(), dout.ptr<T>(), lse.ptr<float>(), delta, qkv.ptr<T>(), seg,
                             s, float(scale));
      INGOT_LAUNCH_CHECK("attention_backward_dkdv_kernel");
      auto dq = attention_backward_dq_kernel<DMAX, T>;
      INGOT_CUDA_CHECK(cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      dq<<<dim3(unsigned(ceil_div(s.T, kBlockQ)), unsigned(s.Hq), unsigned(s.B)), kThreads, smem,
           state.stream>>>(dqkv.ptr<T>(), dout.ptr<T>(), lse.ptr<float>(), delta, qkv.ptr<T>(), seg,
                           s, float(scale));
      INGOT_LAUNCH_CHECK("attention_backward_dq_kernel");
    });
  });
}

int64_t attention_kernels_smem_bytes(int64_t D) { return int64_t(backward_smem_bytes(int(D))); }

}  // namespace ingot::cuda
