// Causal GQA attention backward on Hopper's warpgroup MMA (wgmma, sm_90a), D = 64 or 128: the same
// deterministic three steps, tiles, work order and document skipping as the mma.sync kernels of
// attention_mma_backward.cu, which run everywhere else:
//   1. delta (B,Hq,T) f32 = rowsum(dout * out) (the caller);
//   2. dK, dV: one block (one warpgroup, 64 keys) per (key tile, kv head, batch), over the query
//      heads of its group and the query tiles from the diagonal on that share a document with it:
//      S^T = K Q^T and dP^T = V dO^T from shared memory, P^T and dS^T in registers, then
//      dV += P^T dO and dK += dS^T Q with P^T and dS^T as register A operands;
//   3. dQ: one block (64 queries) per (query tile, query head, batch), over the key tiles up to
//      the diagonal: S = Q K^T, dP = dO V^T, dQ += dS K.
// What changes against mma.sync: no fragment loads from shared memory (wgmma reads the swizzled
// tiles itself, attention_wgmma.cuh), and each product is four instructions for the warpgroup.
#include <cstdlib>
#include <memory>

#include "ingot/core/env.h"
#include "ingot/ops/cuda/attention_wgmma.cuh"

namespace ingot::cuda {

namespace {

using namespace attention_wgmma;
using attention::Shape;
using attention_mma::cp_async_commit;
using attention_mma::cp_async_wait;
using attention_mma::for_each_entry;
using attention_mma::KeyRowsMask;
using attention_mma::KeyTileStream;
using attention_mma::next_meeting;
using attention_mma::QueryRowsMask;
using attention_mma::row_inputs;
using attention_mma::load_row_stats;
using attention_mma::stage_ids;
using attention_mma::stage_row_stats;
using attention_mma::store_key_rows;
using attention_mma::store_query_rows;
using attention_mma::tile_major_block;
using attention_mma::TileBlock;
using attention_mma::zero;

// Both kernels: six tiles (two kept, two streamed double-buffered), lse and delta of the streamed
// query rows double-buffered (dK/dV kernel), segment ids of the kept rows and both streamed
// buffers, and 1 KiB to align the tiles to the swizzle's 1024 bytes: about 51 KiB at D = 64, 99 at 128.
template <int D>
constexpr size_t smem_bytes() {
  return 6 * size_t(tile_bytes<D>()) + 4 * kTile * sizeof(float) + 3 * kTile * sizeof(int) + 1024;
}

__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u);
}

// As mma_attention_backward_dkdv_kernel. Resident blocks an SM: at D = 64, 3 (registers capped at
// 168) measured faster than 2: 2.33 against 2.60 ms for this kernel alone at Llama-3.2-1B's heads,
// when the cap still made ptxas serialise the wgmmas; at D = 128, the tiles allow 2.
template <int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 3 : 2)
    wgmma_attention_backward_dkdv_kernel(bf16* dqkv, const bf16* dout, const float* lse, const float* delta,
                                         const bf16* qkv, const int32_t* segment_ids, const uint2* tile_ranges,
                                         Shape s, float scale, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kTileBytes = tile_bytes<D>();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* Ks = align_1024(smem_raw);
  unsigned char* Vs = Ks + kTileBytes;
  unsigned char* Q_buf = Vs + kTileBytes;          // [2] tiles
  unsigned char* dO_buf = Q_buf + 2 * kTileBytes;  // [2] tiles
  float* lse_buf = reinterpret_cast<float*>(dO_buf + 2 * kTileBytes);  // [2][kTile]
  float* delta_buf = lse_buf + 2 * kTile;                              // [2][kTile]
  int* seg_k = reinterpret_cast<int*>(delta_buf + 2 * kTile);
  int* seg_q_buf = seg_k + kTile;                                      // [2][kTile]

  const int n_tiles = int(gridDim.x);
  const TileBlock block = tile_major_block();
  const int kt = block.tile;  // key tile 0 meets the most query tiles: the heaviest blocks first
  const int g = block.head, b = block.row, group = s.Hq / s.Hkv;
  const int T = s.T, k0 = kt * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row_stride = int64_t(s.Htot()) * D, dout_stride = int64_t(s.Hq) * D;
  const auto [batch, seg_row, ranges] = row_inputs<D>(qkv, segment_ids, tile_ranges, s, b, n_tiles);
  const bf16* dout_batch = dout + int64_t(b) * T * dout_stride;

  auto fetch_queries = [&](int hh, int qt, int buf) {
    const int h = g * group + hh, q0 = qt * kTile;
    stage_tile_async<D>(Q_buf + buf * kTileBytes, batch + int64_t(h) * D, row_stride, q0, T);
    stage_tile_async<D>(dO_buf + buf * kTileBytes, dout_batch + int64_t(h) * D, dout_stride, q0, T);
    stage_row_stats(lse_buf + buf * kTile, delta_buf + buf * kTile, lse + (int64_t(b) * s.Hq + h) * T,
                    delta + (int64_t(b) * s.Hq + h) * T, q0, T);
    stage_ids(seg_q_buf + buf * kTile, seg_row, q0, T);
    cp_async_commit();
  };
  stage_tile_async<D>(Ks, batch + int64_t(s.Hq + g) * D, row_stride, k0, T);
  stage_tile_async<D>(Vs, batch + int64_t(s.Hq + s.Hkv + g) * D, row_stride, k0, T);
  stage_ids(seg_k, seg_row, k0, T);
  int hh = 0, qt = kt;
  fetch_queries(hh, qt, 0);

  const int r_lo = warp * 16 + (lane >> 2);  // this lane's key rows: r_lo and r_lo + 8
  const uint64_t k_desc = k_major_base(smem_u32(Ks)), v_desc = k_major_base(smem_u32(Vs));
  const uint64_t q_k_desc0 = k_major_base(smem_u32(Q_buf)), do_k_desc0 = k_major_base(smem_u32(dO_buf));
  const uint64_t q_mn_desc0 = mn_major_base(smem_u32(Q_buf)), do_mn_desc0 = mn_major_base(smem_u32(dO_buf));
  float dk[D / 8][4], dv[D / 8][4], pt[8][4], dst[8][4];  // pt: S^T then P^T; dst: dP^T then dS^T (64 keys x 64 queries)
  zero(dk);
  zero(dv);
  zero(pt);
  zero(dst);

  for (int buf = 0; hh < group; buf ^= 1) {
    int next_hh = hh, next_qt = next_meeting(ranges, kt, qt, n_tiles - 1);
    if (next_qt == n_tiles) {
      ++next_hh;
      next_qt = kt;
    }
    if (next_hh < group) {
      fetch_queries(next_hh, next_qt, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_async_shared();
    __syncthreads();  // item (hh, qt) (and K, V) visible to every warp and to the tensor cores
    const int q0 = qt * kTile;
    const uint64_t q_k = in_buffer(q_k_desc0, buf, kTileBytes), do_k = in_buffer(do_k_desc0, buf, kTileBytes);
    const uint64_t q_mn = in_buffer(q_mn_desc0, buf, kTileBytes), do_mn = in_buffer(do_mn_desc0, buf, kTileBytes);
    const float* lse_s = lse_buf + buf * kTile;
    const float* delta_s = delta_buf + buf * kTile;
    const int* seg_q = seg_q_buf + buf * kTile;

    // Three commit groups: P^T is computed while dP^T is in flight; dV and dK go together once dS^T
    // is done. (Issuing dV before dS^T kept P^T, dP^T and dV's A fragments live at once: past the
    // 168 registers of 3 blocks an SM at D = 64, so ptxas serialised every wgmma of the kernel.)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss(pt, k_step(k_desc, kk), k_step(q_k, kk), kk);  // S^T = K Q^T
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss(dst, k_step(v_desc, kk), k_step(do_k, kk), kk);  // dP^T = V dO^T
    wgmma_commit();
    wgmma_wait<1>();  // S^T

    const bool masked = (seg_row && !tiles_one_document(ranges, qt, kt)) || qt == kt || q0 + kTile > T;
    const float* lse_lane = lse_s + 2 * (lane & 3);  // this lane's query columns: nt * 8 + 2 (lane & 3), + 1
    const float* delta_lane = delta_s + 2 * (lane & 3);
    for_each_entry(
        masked,
        [&](int nt, int e, bool attends) {
          pt[nt][e] = attends ? exp2_ftz(fmaf(pt[nt][e], scale_log2, -lse_lane[nt * 8 + (e & 1)])) : 0.f;
        },
        KeyRowsMask{q0, k0, T, r_lo, 0, seg_q, seg_k});
    wgmma_wait<0>();  // dP^T
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[nt][e] = pt[nt][e] * (dst[nt][e] - delta_lane[nt * 8 + (e & 1)]);
    wgmma_rs_tile2(dv, pt, do_mn, dk, dst, q_mn);  // dV += P^T dO, dK += dS^T Q
    wgmma_wait<0>();
    __syncthreads();  // every warp is done with this buffer before it is refilled
    hh = next_hh;
    qt = next_qt;
  }

  store_key_rows<D>(dqkv, dk, dv, s, b, g, k0, r_lo, scale);
#else
  __trap();  // launched only where sm_90a code was loaded (attention_wgmma_takes)
#endif
}

// As mma_attention_backward_dq_kernel. At D = 64, 4 blocks an SM (128 registers, no spill).
template <int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 4 : 2)
    wgmma_attention_backward_dq_kernel(bf16* dqkv, const bf16* dout, const float* lse, const float* delta,
                                       const bf16* qkv, const int32_t* segment_ids, const uint2* tile_ranges,
                                       Shape s, float scale, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kTileBytes = tile_bytes<D>();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* Qs = align_1024(smem_raw);
  unsigned char* dOs = Qs + kTileBytes;
  unsigned char* K_buf = dOs + kTileBytes;         // [2] tiles
  unsigned char* V_buf = K_buf + 2 * kTileBytes;   // [2] tiles
  int* seg_q = reinterpret_cast<int*>(V_buf + 2 * kTileBytes);
  int* seg_k_buf = seg_q + kTile;                  // [2][kTile]

  const int n_tiles = int(gridDim.x);
  const TileBlock block = tile_major_block();
  const int qt = n_tiles - 1 - block.tile;  // longest rows first
  const int h = block.head, b = block.row, g = h / (s.Hq / s.Hkv);
  const int T = s.T, q0 = qt * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row_stride = int64_t(s.Htot()) * D, dout_stride = int64_t(s.Hq) * D;
  const auto [batch, seg_row, ranges] = row_inputs<D>(qkv, segment_ids, tile_ranges, s, b, n_tiles);
  const KeyTileStream<D, SwizzledTiles<D>> keys{reinterpret_cast<bf16*>(K_buf), reinterpret_cast<bf16*>(V_buf),
                                                 seg_k_buf, batch + int64_t(s.Hq + g) * D,
                                                 batch + int64_t(s.Hq + s.Hkv + g) * D, row_stride, seg_row, T,
                                                 ranges, qt};

  stage_tile_async<D>(Qs, batch + int64_t(h) * D, row_stride, q0, T);  // land with the first keys
  stage_tile_async<D>(dOs, dout + int64_t(b) * T * dout_stride + int64_t(h) * D, dout_stride, q0, T);
  stage_ids(seg_q, seg_row, q0, T);
  int kt = keys.start();

  const int r_lo = warp * 16 + (lane >> 2);  // this lane's query rows: r_lo and r_lo + 8
  float row_lse[2], row_delta[2];
  load_row_stats(row_lse, row_delta, lse, delta, s, b, h, q0, r_lo);
  const uint64_t q_desc = k_major_base(smem_u32(Qs)), do_desc = k_major_base(smem_u32(dOs));
  const uint64_t k_k_desc0 = k_major_base(smem_u32(K_buf)), v_k_desc0 = k_major_base(smem_u32(V_buf));
  const uint64_t k_mn_desc0 = mn_major_base(smem_u32(K_buf));
  float dq[D / 8][4], p[8][4], ds[8][4];  // p: S then P; ds: dP then dS (64 queries x 64 keys)
  zero(dq);
  zero(p);
  zero(ds);

  for (int buf = 0; kt <= qt; buf ^= 1) {
    const int next = keys.wait_and_prefetch(kt, buf);  // tile kt (and Q, dO) visible to warps and tensor cores
    const int k0 = kt * kTile;
    const uint64_t k_k = in_buffer(k_k_desc0, buf, kTileBytes), v_k = in_buffer(v_k_desc0, buf, kTileBytes);
    const uint64_t k_mn = in_buffer(k_mn_desc0, buf, kTileBytes);
    const int* seg_k = seg_k_buf + buf * kTile;

    // P is computed while dP is in flight.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss(p, k_step(q_desc, kk), k_step(k_k, kk), kk);    // S = Q K^T
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss(ds, k_step(do_desc, kk), k_step(v_k, kk), kk);  // dP = dO V^T
    wgmma_commit();
    wgmma_wait<1>();  // S

    const bool masked = (seg_row && !tiles_one_document(ranges, qt, kt)) || kt == qt || q0 + kTile > T;
    for_each_entry(
        masked,
        [&](int nt, int e, bool attends) {  // 2^x before the select: inside it, ptxas spilled here
          const float pv = exp2_ftz(fmaf(p[nt][e], scale_log2, -row_lse[e >> 1]));
          p[nt][e] = attends ? pv : 0.f;
        },
        QueryRowsMask{q0, k0, T, r_lo, seg_q, seg_k});
    wgmma_wait<0>();  // dP
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - row_delta[e >> 1]);

    wgmma_rs_tile(dq, ds, k_mn);  // dQ += dS K
    wgmma_wait<0>();
    __syncthreads();  // every warp is done with this buffer before it is refilled
    kt = next;
  }

  store_query_rows<D>(dqkv, dq, s, b, h, q0, r_lo, scale);
#else
  __trap();
#endif
}

}  // namespace

namespace {

// Writes 1 where the code the driver loaded for this module is sm_90a's (with wgmma), else 0.
__global__ void wgmma_code_probe_kernel(int* loaded) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *loaded = 1;
#else
  *loaded = 0;
#endif
}

}  // namespace

bool attention_wgmma_code_loaded(cudaStream_t stream) {
  int* raw = nullptr;
  INGOT_CUDA_CHECK(cudaMalloc(&raw, sizeof(int)));
  const std::unique_ptr<int, decltype(&cudaFree)> flag(raw, &cudaFree);  // freed on the error paths too
  wgmma_code_probe_kernel<<<1, 1, 0, stream>>>(flag.get());
  INGOT_LAUNCH_CHECK("wgmma_code_probe_kernel");
  int loaded = 0;
  INGOT_CUDA_CHECK(cudaMemcpyAsync(&loaded, flag.get(), sizeof(int), cudaMemcpyDeviceToHost, stream));
  INGOT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return loaded == 1;
}

// The backward's shared memory is the larger: it decides for both directions.
bool attention_wgmma_takes(const CudaState& state, int D) {
  if (!state.wgmma_code || (D != 64 && D != 128)) return false;
  if (env_flag("INGOT_ATTENTION_MMA_SYNC")) return false;
  return int64_t(D == 64 ? smem_bytes<64>() : smem_bytes<128>()) <= state.max_smem_per_block;
}

namespace {

template <int D>
void launch(CudaState& state, bf16* dqkv, const bf16* dout, const float* lse, const float* delta, const bf16* qkv,
            const int32_t* segment_ids, const uint2* ranges, const Shape& s, double scale) {
  const unsigned n_tiles = unsigned(ceil_div(s.T, kTile));
  const float scale_f = float(scale), scale_log2 = float(scale) * attention::kLog2e;
  const int smem = int(smem_bytes<D>());
  auto dkdv = wgmma_attention_backward_dkdv_kernel<D>;
  INGOT_CUDA_CHECK(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  dkdv<<<dim3(n_tiles, unsigned(s.Hkv), unsigned(s.B)), kThreads, smem, state.stream>>>(
      dqkv, dout, lse, delta, qkv, segment_ids, ranges, s, scale_f, scale_log2);
  INGOT_LAUNCH_CHECK("wgmma_attention_backward_dkdv_kernel");
  auto dq = wgmma_attention_backward_dq_kernel<D>;
  INGOT_CUDA_CHECK(cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  dq<<<dim3(n_tiles, unsigned(s.Hq), unsigned(s.B)), kThreads, smem, state.stream>>>(
      dqkv, dout, lse, delta, qkv, segment_ids, ranges, s, scale_f, scale_log2);
  INGOT_LAUNCH_CHECK("wgmma_attention_backward_dq_kernel");
}

}  // namespace

void attention_wgmma_backward(CudaState& state, bf16* dqkv, const bf16* dout, const float* lse, const float* delta,
                              const bf16* qkv, const int32_t* segment_ids, const uint2* ranges, const Shape& s,
                              double scale) {
  if (s.D == 64) launch<64>(state, dqkv, dout, lse, delta, qkv, segment_ids, ranges, s, scale);
  else launch<128>(state, dqkv, dout, lse, delta, qkv, segment_ids, ranges, s, scale);
}

}  // namespace ingot::cuda
