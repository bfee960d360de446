// Causal GQA attention backward on tensor cores: dqkv (B,T,Htot,D) bf16, overwritten, from dout
// and out (B,T,Hq,D) bf16, lse (B,Hq,T) f32, qkv and optional segment_ids (B,T). Layout, fragments
// and tile skipping: attention_mma.cuh; dispatch: attention_mma.h.
// Deterministic (no atomics), in the same three steps as the CUDA-core kernels:
//   1. delta (B,Hq,T) f32 = rowsum(dout * out);
//   2. dK, dV: one block per (key tile, kv head, batch), each warp owning 16 keys, loops over the
//      query heads of its group and the query tiles at or below the diagonal that share a
//      document with the key tile: S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T - lse),
//      dS^T = P^T (dP^T - delta); dV += P^T dO, dK += dS^T Q, with P^T and dS^T going from the
//      accumulators straight into the next mma;
//   3. dQ: one block per (query tile, query head, batch), each warp owning 16 queries, loops over
//      the key tiles up to the diagonal: S, dP, P, dS as above, dQ += dS K.
// Recomputing S and dP in both kernels costs 7 tile products instead of 5: the price of a fixed
// summation order for dQ.
#include <cmath>

#include "ingot/ops/cuda/attention_cudnn.h"
#include "ingot/ops/cuda/attention_mma.cuh"
#include "ingot/ops/cuda/attention_mma.h"
#include "ingot/ops/cuda/attention_wgmma.cuh"

namespace ingot::cuda {

namespace {

using namespace attention_mma;
using attention::Shape;

// At D = 64, 3 blocks an SM (168 registers; on sm_90a 132 bytes spilled since the tile-major block
// order, a few elsewhere) beat 2 (194 registers): the kernel
// is latency-bound, and the third block's warps hide it (perf.md, optimisation log). At D = 128
// the tiles' shared memory allows 2 blocks whatever the registers.
template <int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 3 : 1)
    mma_attention_backward_dkdv_kernel(bf16* dqkv, const bf16* dout, const float* lse, const float* delta,
                                       const bf16* qkv, const int32_t* segment_ids, const uint2* tile_ranges,
                                       Shape s, float scale, float scale_log2) {
  constexpr int kS = tile_stride<D>();
  // Queries per pass over a staged tile: at D = 128, S^T and dP^T for all 64 would not fit in
  // registers beside the dK and dV accumulators.
  constexpr int kChunk = D == 128 ? 16 : 64;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kTile * kS;
  bf16* Q_buf = Vs + kTile * kS;           // [2][kTile * kS]
  bf16* dO_buf = Q_buf + 2 * kTile * kS;   // [2][kTile * kS]
  float* lse_buf = reinterpret_cast<float*>(dO_buf + 2 * kTile * kS);  // [2][kTile]
  float* delta_buf = lse_buf + 2 * kTile;  // [2][kTile]
  int* seg_k = reinterpret_cast<int*>(delta_buf + 2 * kTile);
  int* seg_q_buf = seg_k + kTile;          // [2][kTile]

  const int n_tiles = int(gridDim.x);
  const TileBlock block = tile_major_block();
  const int kt = block.tile;  // key tile 0 meets the most query tiles: the heaviest blocks first
  const int g = block.head, b = block.row, group = s.Hq / s.Hkv;
  const int T = s.T, k0 = kt * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row_stride = int64_t(s.Htot()) * D, dout_stride = int64_t(s.Hq) * D;
  const auto [batch, seg_row, ranges] = row_inputs<D>(qkv, segment_ids, tile_ranges, s, b, n_tiles);
  const bf16* dout_batch = dout + int64_t(b) * T * dout_stride;

  // The work is a sequence of (query head of the group, query tile) items: for each head, the
  // query tiles from the diagonal on that meet this key tile (the same tiles for every head).
  auto fetch_queries = [&](int hh, int qt, int buf) {
    const int h = g * group + hh, q0 = qt * kTile;
    stage_tile_async<D>(Q_buf + buf * kTile * kS, batch + int64_t(h) * D, row_stride, q0, T);
    stage_tile_async<D>(dO_buf + buf * kTile * kS, dout_batch + int64_t(h) * D, dout_stride, q0, T);
    stage_row_stats(lse_buf + buf * kTile, delta_buf + buf * kTile, lse + (int64_t(b) * s.Hq + h) * T,
                    delta + (int64_t(b) * s.Hq + h) * T, q0, T);
    stage_ids(seg_q_buf + buf * kTile, seg_row, q0, T);
    cp_async_commit();
  };
  stage_tile_async<D>(Ks, batch + int64_t(s.Hq + g) * D, row_stride, k0, T);  // land with the first queries
  stage_tile_async<D>(Vs, batch + int64_t(s.Hq + s.Hkv + g) * D, row_stride, k0, T);
  stage_ids(seg_k, seg_row, k0, T);
  int hh = 0, qt = kt;  // the diagonal tile meets itself: the first item
  fetch_queries(hh, qt, 0);

  const int r_lo = warp * 16 + (lane >> 2);  // this lane's key rows: r_lo and r_lo + 8
  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);

  for (int buf = 0; hh < group; buf ^= 1) {
    int next_hh = hh, next_qt = next_meeting(ranges, kt, qt, n_tiles - 1);  // the same for the whole block
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
    __syncthreads();  // item (hh, qt) (and K, V) visible to every warp
    const int q0 = qt * kTile;
    const bf16* Qs = Q_buf + buf * kTile * kS;
    const bf16* dOs = dO_buf + buf * kTile * kS;
    const float* lse_s = lse_buf + buf * kTile;
    const float* delta_s = delta_buf + buf * kTile;
    const int* seg_q = seg_q_buf + buf * kTile;

    const bool masked = seg_row || qt == kt || q0 + kTile > T;
#pragma unroll
    for (int c = 0; c < kTile / kChunk; ++c) {
      float pt[kChunk / 8][4], dst[kChunk / 8][4];  // P^T, then dS^T, of 16 keys x kChunk queries
      zero(pt);
      zero(dst);
      mma_a_bt<D, kChunk / 8>(pt, Ks, warp * 16, Qs, c * kChunk, kS);   // S^T = K Q^T
      mma_a_bt<D, kChunk / 8>(dst, Vs, warp * 16, dOs, c * kChunk, kS);  // dP^T = V dO^T
      const int lane_q = c * kChunk + 2 * (lane & 3);  // this lane's query columns: lane_q + nt * 8, + 1
      for_each_entry<kChunk / 8>(
          masked,
          [&](int nt, int e, bool attends) {
            const int qc = lane_q + nt * 8 + (e & 1);
            const float p = attends ? exp2f(fmaf(pt[nt][e], scale_log2, -lse_s[qc])) : 0.f;
            pt[nt][e] = p;
            dst[nt][e] = p * (dst[nt][e] - delta_s[qc]);
          },
          KeyRowsMask{q0, k0, T, r_lo, c * kChunk, seg_q, seg_k});
      mma_c_b<D, kChunk / 8>(dv, pt, dOs, c * kChunk, kS);  // dV += P^T dO
      mma_c_b<D, kChunk / 8>(dk, dst, Qs, c * kChunk, kS);  // dK += dS^T Q
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
    hh = next_hh;
    qt = next_qt;
  }

  store_key_rows<D>(dqkv, dk, dv, s, b, g, k0, r_lo, scale);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    mma_attention_backward_dq_kernel(bf16* dqkv, const bf16* dout, const float* lse, const float* delta,
                                     const bf16* qkv, const int32_t* segment_ids, const uint2* tile_ranges,
                                     Shape s, float scale, float scale_log2) {
  constexpr int kS = tile_stride<D>();
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* dOs = Qs + kTile * kS;
  bf16* K_buf = dOs + kTile * kS;         // [2][kTile * kS]
  bf16* V_buf = K_buf + 2 * kTile * kS;   // [2][kTile * kS]
  int* seg_q = reinterpret_cast<int*>(V_buf + 2 * kTile * kS);  // (the lse/delta room of the layout unused)
  int* seg_k_buf = seg_q + kTile;         // [2][kTile]

  const int n_tiles = int(gridDim.x);
  const TileBlock block = tile_major_block();
  const int qt = n_tiles - 1 - block.tile;  // longest rows first
  const int h = block.head, b = block.row, g = h / (s.Hq / s.Hkv);
  const int T = s.T, q0 = qt * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row_stride = int64_t(s.Htot()) * D, dout_stride = int64_t(s.Hq) * D;
  const auto [batch, seg_row, ranges] = row_inputs<D>(qkv, segment_ids, tile_ranges, s, b, n_tiles);
  const KeyTileStream<D> keys{K_buf, V_buf, seg_k_buf, batch + int64_t(s.Hq + g) * D,
                              batch + int64_t(s.Hq + s.Hkv + g) * D, row_stride, seg_row, T, ranges, qt};

  stage_tile_async<D>(Qs, batch + int64_t(h) * D, row_stride, q0, T);  // land with the first keys
  stage_tile_async<D>(dOs, dout + int64_t(b) * T * dout_stride + int64_t(h) * D, dout_stride, q0, T);
  stage_ids(seg_q, seg_row, q0, T);
  int kt = keys.start();

  const int r_lo = warp * 16 + (lane >> 2);  // this lane's query rows: r_lo and r_lo + 8
  float row_lse[2], row_delta[2];
  load_row_stats(row_lse, row_delta, lse, delta, s, b, h, q0, r_lo);
  float dq[D / 8][4];
  zero(dq);

  for (int buf = 0; kt <= qt; buf ^= 1) {
    const int next = keys.wait_and_prefetch(kt, buf);  // tile kt (and Q, dO) visible to every warp
    const int k0 = kt * kTile;
    const bf16* Ks = keys.K(buf);
    const bf16* Vs = keys.V(buf);
    const int* seg_k = keys.ids(buf);

    float p[kTile / 8][4], ds[kTile / 8][4];  // P, then dS, of 16 queries x 64 keys
    zero(p);
    zero(ds);
    mma_a_bt<D, kTile / 8>(p, Qs, warp * 16, Ks, 0, kS);    // S = Q K^T
    mma_a_bt<D, kTile / 8>(ds, dOs, warp * 16, Vs, 0, kS);  // dP = dO V^T
    const bool masked = seg_row || kt == qt || k0 + kTile > T;
    for_each_entry(
        masked,
        [&](int nt, int e, bool attends) {
          const float pv = attends ? exp2f(fmaf(p[nt][e], scale_log2, -row_lse[e >> 1])) : 0.f;
          ds[nt][e] = pv * (ds[nt][e] - row_delta[e >> 1]);
        },
        QueryRowsMask{q0, k0, T, r_lo, seg_q, seg_k});
    mma_c_b<D, kTile / 8>(dq, ds, Ks, 0, kS);  // dQ += dS K
    __syncthreads();  // every warp is done with this buffer before it is refilled
    kt = next;
  }

  store_query_rows<D>(dqkv, dq, s, b, h, q0, r_lo, scale);
}

template <int D>
void launch_backward(CudaState& state, bf16* dqkv, const bf16* dout, const float* lse, const float* delta,
                     const bf16* qkv, const int32_t* segment_ids, const uint2* ranges, const Shape& s,
                     double scale) {
  const size_t smem = backward_smem_bytes<D>();
  const unsigned n_tiles = unsigned(ceil_div(s.T, kTile));
  const float scale_f = float(scale), scale_log2 = float(scale) * attention::kLog2e;
  auto dkdv = mma_attention_backward_dkdv_kernel<D>;
  INGOT_CUDA_CHECK(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dkdv<<<dim3(n_tiles, unsigned(s.Hkv), unsigned(s.B)), kThreads, smem, state.stream>>>(
      dqkv, dout, lse, delta, qkv, segment_ids, ranges, s, scale_f, scale_log2);
  INGOT_LAUNCH_CHECK("mma_attention_backward_dkdv_kernel");
  auto dq = mma_attention_backward_dq_kernel<D>;
  INGOT_CUDA_CHECK(cudaFuncSetAttribute(dq, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dq<<<dim3(n_tiles, unsigned(s.Hq), unsigned(s.B)), kThreads, smem, state.stream>>>(
      dqkv, dout, lse, delta, qkv, segment_ids, ranges, s, scale_f, scale_log2);
  INGOT_LAUNCH_CHECK("mma_attention_backward_dq_kernel");
}

thread_local const char* g_kernels = "none";

}  // namespace

const char* attention_mma_kernels() { return g_kernels; }
void attention_set_mma_kernels(const char* kernels) { g_kernels = kernels; }

bool attention_wgmma_available(Context& ctx, int D) {
  return attention_wgmma_takes(state_of(ctx, "attention_backward (tensor cores)"), D);
}

bool attention_mma_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse, Tensor qkv,
                            Tensor segment_ids, int n_q_heads, int n_kv_heads, double scale) {
  constexpr const char* op = "attention_backward (tensor cores)";
  const Shape s{int(qkv.dim(0)), int(qkv.dim(1)), n_q_heads, n_kv_heads, int(qkv.dim(3))};
  if (!attention_mma_supports(ctx, qkv, n_q_heads, /*backward=*/true)) return false;
  for (const Tensor* t : {&dqkv, &dout, &out})
    if (t->dtype != DType::bf16) return false;
  // out is read only by the delta kernel, element by element; the others go through 16-byte copies.
  for (const Tensor* t : {&dqkv, &dout})
    if (!aligned16(t->data)) return false;
  CudaState& state = state_of(ctx, op);
  // Scratch: delta (B,Hq,T) f32, then the tile ranges (B, n_tiles) uint2 with segment ids.
  const int64_t rows = int64_t(s.B) * s.Hq * s.T;
  const int64_t delta_bytes = (rows * int64_t(sizeof(float)) + 255) / 256 * 256;
  const int32_t* seg = segment_ids.present() ? segment_ids.ptr<int32_t>() : nullptr;
  const int64_t range_bytes = seg ? int64_t(s.B) * ceil_div(s.T, kTile) * int64_t(sizeof(uint2)) : 0;
  char* scratch = static_cast<char*>(scratch_buffer(state, delta_bytes + range_bytes, op));
  float* delta = reinterpret_cast<float*>(scratch);
  uint2* ranges = seg ? reinterpret_cast<uint2*>(scratch + delta_bytes) : nullptr;
  if (seg) tile_segment_ranges(state, ranges, seg, nullptr, s.B, s.T);
  attention::attention_delta_kernel<bf16><<<grid_for(rows * 32, 256, state), 256, 0, state.stream>>>(
      delta, dout.ptr<bf16>(), out.ptr<bf16>(), s);
  INGOT_LAUNCH_CHECK("attention_delta_kernel");
  if (attention_wgmma_takes(state, s.D)) {
    attention_wgmma_backward(state, dqkv.ptr<bf16>(), dout.ptr<bf16>(), lse.ptr<float>(), delta, qkv.ptr<bf16>(), seg,
                             ranges, s, scale);
    attention_set_mma_kernels("wgmma");
  } else if (s.D == 64) {
    launch_backward<64>(state, dqkv.ptr<bf16>(), dout.ptr<bf16>(), lse.ptr<float>(), delta, qkv.ptr<bf16>(), seg,
                        ranges, s, scale);
    attention_set_mma_kernels("mma.sync");
  } else {
    launch_backward<128>(state, dqkv.ptr<bf16>(), dout.ptr<bf16>(), lse.ptr<float>(), delta, qkv.ptr<bf16>(), seg,
                         ranges, s, scale);
    attention_set_mma_kernels("mma.sync");
  }
  attention_set_last_path("mma");
  return true;
}

}  // namespace ingot::cuda
