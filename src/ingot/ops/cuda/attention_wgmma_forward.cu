// Causal GQA attention forward on Hopper's warpgroup MMA (wgmma, sm_90a), D = 64 or 128: the tiles,
// work order, document skipping and online softmax of mma_attention_forward_kernel
// (attention_mma_forward.cu, which runs everywhere else), with the products on wgmma: S = Q K^T
// from shared memory, O += P V with P as the register A operand and V read MN-major
// (attention_wgmma.cuh).
#include <cmath>

#include "ingot/ops/cuda/attention_wgmma.cuh"

namespace ingot::cuda {

namespace {

using namespace attention_wgmma;
using attention::Shape;
using attention_mma::cp_async_commit;
using attention_mma::cp_async_wait;
using attention_mma::next_meeting;
using attention_mma::stage_ids;
using attention_mma::tile_is_empty;
using attention_mma::zero;

// Q | K, V double-buffered | segment ids of the query rows and both key buffers | 1 KiB to align
// the tiles to the swizzle's 1024 bytes. 42 KiB at D = 64, 82 at 128.
template <int D>
constexpr size_t forward_smem_bytes() {
  return 5 * size_t(tile_bytes<D>()) + 3 * kTile * sizeof(int) + 1024;
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    wgmma_attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* segment_ids,
                                   const uint2* tile_ranges, Shape s, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kTileBytes = tile_bytes<D>();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* Qs = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  unsigned char* K_buf = Qs + kTileBytes;         // [2] tiles
  unsigned char* V_buf = K_buf + 2 * kTileBytes;  // [2] tiles
  int* seg_q = reinterpret_cast<int*>(V_buf + 2 * kTileBytes);
  int* seg_k_buf = seg_q + kTile;                 // [2][kTile]

  const int n_tiles = int(gridDim.x);
  const int qt = n_tiles - 1 - int(blockIdx.x);  // longest rows first: the grid's tail is short work
  const int h = blockIdx.y, b = blockIdx.z, g = h / (s.Hq / s.Hkv);
  const int T = s.T, q0 = qt * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row_stride = int64_t(s.Htot()) * D;
  const bf16* batch = qkv + int64_t(b) * T * row_stride;
  const int32_t* seg_row = segment_ids ? segment_ids + int64_t(b) * T : nullptr;
  const uint2* ranges = tile_ranges ? tile_ranges + int64_t(b) * n_tiles : nullptr;
  if (tile_is_empty(ranges, qt)) return;
  const bf16* k_head = batch + int64_t(s.Hq + g) * D;
  const bf16* v_head = batch + int64_t(s.Hq + s.Hkv + g) * D;

  auto fetch_keys = [&](int kt, int buf) {
    stage_tile_async<D>(K_buf + buf * kTileBytes, k_head, row_stride, kt * kTile, T);
    stage_tile_async<D>(V_buf + buf * kTileBytes, v_head, row_stride, kt * kTile, T);
    stage_ids(seg_k_buf + buf * kTile, seg_row, kt * kTile, T);
    cp_async_commit();
  };
  stage_tile_async<D>(Qs, batch + int64_t(h) * D, row_stride, q0, T);  // lands with the first keys
  stage_ids(seg_q, seg_row, q0, T);
  int kt = next_meeting(ranges, qt, -1, qt);
  fetch_keys(kt, 0);

  // This lane's query rows within the tile: r_lo (accumulator entries 0, 1) and r_lo + 8 (2, 3).
  const int r_lo = warp * 16 + (lane >> 2);
  const uint64_t q_desc = k_major_base(smem_u32(Qs));
  const uint64_t k_desc0 = k_major_base(smem_u32(K_buf)), v_desc0 = mn_major_base(smem_u32(V_buf));
  float o[D / 8][4], sc[8][4];  // sc: scores, then P, of rows r_lo, r_lo + 8 against the tile's 64 keys
  zero(o);
  zero(sc);
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // this lane's share of each row sum; the quad's shares add up at the end

  for (int buf = 0; kt <= qt; buf ^= 1) {
    const int next = next_meeting(ranges, qt, kt, qt);
    if (next <= qt) {
      fetch_keys(next, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_async_shared();
    __syncthreads();  // tile kt (and Q) visible to every warp and to the tensor cores
    const int k0 = kt * kTile;
    const uint64_t k_desc = in_buffer(k_desc0, buf, kTileBytes), v_desc = in_buffer(v_desc0, buf, kTileBytes);
    const int* seg_k = seg_k_buf + buf * kTile;

    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss(sc, k_step(q_desc, kk), k_step(k_desc, kk), kk);  // S = Q K^T
    wgmma_commit();
    wgmma_wait<0>();

    const bool masked = seg_row || kt == qt || k0 + kTile > T;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rr = r_lo + (e >> 1) * 8, cc = nt * 8 + 2 * (lane & 3) + (e & 1);
        float x = sc[nt][e] * scale_log2;
        if (masked && !attention::attends(q0 + rr, k0 + cc, T, seg_q[rr], seg_k[cc])) x = -INFINITY;
        sc[nt][e] = x;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
      }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      base[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with no key so far: exp2(-inf) = 0
      const float alpha = exp2_ftz(m[r] - base[r]);
      m[r] = m_new;
      l[r] *= alpha;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * r] *= alpha;
        o[dt][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2_ftz(sc[nt][e] - base[e >> 1]);
        sc[nt][e] = p;
        l[e >> 1] += p;
      }

    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {  // O += P V
      uint32_t a[4];
      a_fragment(a, sc, kk);
      wgmma_rs(o, a, mn_step(v_desc, kk));
    }
    wgmma_commit();
    wgmma_wait<0>();
    __syncthreads();  // every warp is done with this buffer before it is refilled
    kt = next;
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int i = q0 + r_lo + 8 * r;
    if (i >= T) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    bf16* dst = out + (int64_t(b) * T + i) * s.Hq * D + int64_t(h) * D + 2 * (lane & 3);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(dst + dt * 8) = pack_bf16x2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if ((lane & 3) == 0)
      lse[(int64_t(b) * s.Hq + h) * T + i] = l[r] > 0.f ? (m[r] + log2f(l[r])) * attention::kLn2 : -INFINITY;
  }
#else
  __trap();  // launched only where sm_90a code was built (attention_wgmma_takes)
#endif
}

template <int D>
void launch(CudaState& state, bf16* out, float* lse, const bf16* qkv, const int32_t* segment_ids, const uint2* ranges,
            const Shape& s, double scale) {
  const int smem = int(forward_smem_bytes<D>());
  auto kernel = wgmma_attention_forward_kernel<D>;
  INGOT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(unsigned(ceil_div(s.T, kTile)), unsigned(s.Hq), unsigned(s.B));
  kernel<<<grid, kThreads, smem, state.stream>>>(out, lse, qkv, segment_ids, ranges, s,
                                                 float(scale) * attention::kLog2e);
  INGOT_LAUNCH_CHECK("wgmma_attention_forward_kernel");
}

}  // namespace

void attention_wgmma_forward(CudaState& state, bf16* out, float* lse, const bf16* qkv, const int32_t* segment_ids,
                             const uint2* ranges, const Shape& s, double scale) {
  if (s.D == 64) launch<64>(state, out, lse, qkv, segment_ids, ranges, s, scale);
  else launch<128>(state, out, lse, qkv, segment_ids, ranges, s, scale);
}

}  // namespace ingot::cuda
