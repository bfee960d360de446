// Causal GQA attention forward: out (B,T,Hq,D), lse (B,Hq,T) f32, from packed qkv (B,T,Htot,D),
// optional segment_ids (B,T) for document masking. Tiling and thread layout: attention_common.cuh.
// Per (query tile, head, batch) block: stream key tiles up to the diagonal, online softmax in the
// log2 domain (scores pre-multiplied by scale*log2e), O rescaled per tile, normalised once at
// the end. Rows that see no key (impossible with causal masking: i attends to itself) would get
// out = 0 and lse = -inf.
#include <cmath>

#include "ingot/ops/cuda/attention_common.cuh"
#include "ingot/ops/cuda/attention_cudnn.h"
#include "ingot/ops/cuda/attention_mma.h"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

using namespace attention;

template <int DMAX, typename T>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(T* out, float* lse, const T* qkv, const int32_t* segment_ids,
                                         Shape s, float scale_log2) {
  extern __shared__ float smem[];
  constexpr int J = DMAX / 16;
  const int D = s.D, DP = D + 1, T_len = s.T, Htot = s.Htot();
  float* Qs = smem;
  float* Ks = Qs + kBlockQ * DP;
  float* Vs = Ks + kBlockK * DP;
  float* Ss = Vs + kBlockK * DP;
  float* m_s = Ss + kBlockQ * (kBlockK + 1);
  float* l_s = m_s + kBlockQ;
  float* alpha_s = l_s + kBlockQ;
  int* seg_q = reinterpret_cast<int*>(alpha_s + kBlockQ);
  int* seg_k = seg_q + kBlockQ;

  const int q0 = blockIdx.x * kBlockQ, h = blockIdx.y, b = blockIdx.z;
  const int g = h / (s.Hq / s.Hkv);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row_stride = int64_t(Htot) * D;
  const T* q_base = qkv + int64_t(b) * T_len * row_stride + int64_t(h) * D;
  const T* k_base = qkv + int64_t(b) * T_len * row_stride + int64_t(s.Hq + g) * D;
  const T* v_base = qkv + int64_t(b) * T_len * row_stride + int64_t(s.Hq + s.Hkv + g) * D;
  const int32_t* seg = segment_ids ? segment_ids + int64_t(b) * T_len : nullptr;

  load_tile(Qs, q_base, row_stride, q0, kBlockQ, T_len, D);
  for (int r = threadIdx.x; r < kBlockQ; r += blockDim.x) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
    seg_q[r] = seg && q0 + r < T_len ? seg[q0 + r] : 0;
  }

  float o[4][J];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int j = 0; j < J; ++j) o[a][j] = 0.f;

  const int last_key = min(T_len - 1, q0 + kBlockQ - 1);
  for (int k0 = 0; k0 <= last_key; k0 += kBlockK) {
    load_tile(Ks, k_base, row_stride, k0, kBlockK, T_len, D);
    load_tile(Vs, v_base, row_stride, k0, kBlockK, T_len, D);
    for (int r = threadIdx.x; r < kBlockK; r += blockDim.x) seg_k[r] = seg && k0 + r < T_len ? seg[k0 + r] : 0;
    __syncthreads();

    // S = Q K^T for this thread's 4 x 4 entries.
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][c] = 0.f;
    for (int d = 0; d < D; ++d) {
      float qa[4], kc[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) qa[a] = Qs[(ty * 4 + a) * DP + d];
#pragma unroll
      for (int c = 0; c < 4; ++c) kc[c] = Ks[(tx + 16 * c) * DP + d];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[a][c] += qa[a] * kc[c];
    }
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = ty * 4 + a, col = tx + 16 * c;
        const bool ok = attends(q0 + r, k0 + col, T_len, seg_q[r], seg_k[col]);
        Ss[r * (kBlockK + 1) + col] = ok ? acc[a][c] * scale_log2 : -INFINITY;
      }
    __syncthreads();

    // Online softmax: warp w owns rows 8w .. 8w+7; lanes cover columns lane and lane + 32.
    for (int r = warp * 8; r < warp * 8 + 8; ++r) {
      float* row = Ss + r * (kBlockK + 1);
      const float x0 = row[lane], x1 = row[lane + 32];
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(x0, x1)));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: keep exp2 finite
      const float p0 = exp2f(x0 - m_use), p1 = exp2f(x1 - m_use);
      row[lane] = p0;
      row[lane + 32] = p1;
      const float sum = warp_sum(p0 + p1);
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_use);  // m_old = -inf -> 0
        alpha_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
      }
    }
    __syncthreads();

    // O = O * alpha + P V.
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const float alpha = alpha_s[ty * 4 + a];
#pragma unroll
      for (int j = 0; j < J; ++j) o[a][j] *= alpha;
    }
    for (int k = 0; k < kBlockK; ++k) {
      float p[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) p[a] = Ss[(ty * 4 + a) * (kBlockK + 1) + k];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int d = tx + 16 * j;
        const float v = d < D ? Vs[k * DP + d] : 0.f;
#pragma unroll
        for (int a = 0; a < 4; ++a) o[a][j] += p[a] * v;
      }
    }
    __syncthreads();  // K, V, S are overwritten by the next tile
  }

  T* out_base = out + (int64_t(b) * T_len * s.Hq + h) * D;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int r = ty * 4 + a, i = q0 + r;
    if (i >= T_len) continue;
    const float l = l_s[r];
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int d = tx + 16 * j;
      if (d < D) out_base[int64_t(i) * s.Hq * D + d] = from_f32<T>(o[a][j] * inv_l);
    }
    if (tx == 0)
      lse[(int64_t(b) * s.Hq + h) * T_len + i] = l > 0.f ? (m_s[r] + log2f(l)) * kLn2 : -INFINITY;
  }
}

}  // namespace

void attention_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                       int n_q_heads, int n_kv_heads, double scale) {
  constexpr const char* op = "attention_forward";
  CudaState& state = state_of(ctx, op);
  check_tensor(out, op, "out");
  check_tensor(lse, op, "lse");
  check_tensor(qkv, op, "qkv");
  check_float(qkv, op, "qkv");
  check_dtype(out, qkv.dtype, op, "out");
  check_dtype(lse, DType::f32, op, "lse");
  INGOT_CHECK(qkv.ndim == 4, op, ": qkv must be (B,T,Htot,D), got ", qkv.shape_string());
  INGOT_CHECK(n_q_heads > 0 && n_kv_heads > 0 && n_q_heads % n_kv_heads == 0, op, ": Hq ",
              n_q_heads, " must be a positive multiple of Hkv ", n_kv_heads);
  const Shape s{int(qkv.dim(0)), int(qkv.dim(1)), n_q_heads, n_kv_heads, int(qkv.dim(3))};
  INGOT_CHECK(qkv.dim(2) == s.Htot(), op, ": qkv ", qkv.shape_string(), " has ", qkv.dim(2),
              " heads, expected Hq + 2*Hkv = ", s.Htot());
  check_numel(out, int64_t(s.B) * s.T * s.Hq * s.D, op, "out");
  check_numel(lse, int64_t(s.B) * s.Hq * s.T, op, "lse");
  if (segment_ids.present()) {
    check_tensor(segment_ids, op, "segment_ids");
    check_dtype(segment_ids, DType::i32, op, "segment_ids");
    check_numel(segment_ids, int64_t(s.B) * s.T, op, "segment_ids");
  }
  if (s.B == 0 || s.T == 0) return;
  // cuDNN's fused flash attention where it applies (attention_cudnn.h): whole rows, or packed rows
  // with cuDNN taking the long documents; then Ingot's tensor-core kernels (attention_mma.h), else
  // the CUDA-core kernels below.
  if (attention_cudnn_forward(ctx, out, lse, qkv, segment_ids, n_q_heads, n_kv_heads, scale)) return;
  if (attention_cudnn_documents_forward(ctx, out, lse, qkv, segment_ids, n_q_heads, n_kv_heads, scale))
    return;
  if (attention_mma_forward(ctx, out, lse, qkv, segment_ids, n_q_heads, n_kv_heads, scale)) return;
  attention_set_last_path("kernels");
  INGOT_CHECK(s.D % 8 != 0 || aligned16(qkv.data), op, ": qkv must be 16-byte aligned");
  const size_t smem = forward_smem_bytes(s.D);
  check_kernels_fit(s.D, smem, state.max_smem_per_block, op);
  const dim3 grid(unsigned(ceil_div(s.T, kBlockQ)), unsigned(s.Hq), unsigned(s.B));
  const float scale_log2 = float(scale) * kLog2e;
  dispatch_float(qkv.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    dispatch_head_dim(s.D, op, [&](auto dmax) {
      auto kernel = attention_forward_kernel<decltype(dmax)::value, T>;
      INGOT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      kernel<<<grid, kThreads, smem, state.stream>>>(
          out.ptr<T>(), lse.ptr<float>(), qkv.ptr<T>(),
          segment_ids.present() ? segment_ids.ptr<int32_t>() : nullptr, s, scale_log2);
      INGOT_LAUNCH_CHECK("attention_forward_kernel");
    });
  });
}

}  // namespace ingot::cuda
