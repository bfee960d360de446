// Shared pieces of the tensor-core attention kernels (attention_mma_forward.cu,
// attention_mma_backward.cu): flash-attention-2 style on mma.sync.m16n8k16 (bf16 operands, f32
// accumulators) and cp.async, both sm_80 and later; the dispatch (attention_mma.h) also checks
// that the device's shared memory per block holds the kernels' tiles.
//
// Tiles: 64 query rows x 64 key rows; 128 threads = 4 warps, each warp owning 16 rows of its
// block's tile (queries in the forward and dQ kernels, keys in the dK/dV kernel). Tiles are staged
// in shared memory as bf16 rows of D + 8 elements: the pad puts the 8 rows one ldmatrix reads in
// distinct banks. The streamed tiles (K, V; or Q, dO in the dK/dV kernel) are double-buffered:
// cp.async fetches the next tile that meets the block's own while the warps compute on this one.
//
// Fragments (PTX ISA, mma.m16n8k16 .bf16), for lane = 4 r + c:
//   A (16 x 16, row major)  rows r and r + 8, columns 2c, 2c+1 and 2c+8, 2c+9;
//   B (16 x 8)              k rows 2c, 2c+1 and 2c+8, 2c+9 of column r;
//   C (16 x 8, f32)         c[0], c[1]: row r, columns 2c, 2c+1; c[2], c[3]: row r + 8.
// So the C fragments of two neighbouring 8-column tiles, rounded to bf16, are the A fragment of a
// product along those 16 columns: P from S and dS from dP go to the next mma without shared memory.
//
// Document masking (ops.h): token i attends to token j iff j <= i, both < T and seg[i] == seg[j].
// A (query tile, key tile) pair is skipped when the tiles' [min id, max id] ranges (ids compared
// as uint32) do not overlap. That is exact for any ids; for the loader's packed rows (ids 0, 1,
// 2, ... then -1 padding) it leaves only the tile pairs that share a document (or the padding).
#pragma once
#include <cmath>

#include "ingot/ops/cuda/attention_common.cuh"

namespace ingot::cuda::attention_mma {

constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

template <int D>
constexpr int tile_stride() { return D + 8; }  // bf16 elements between rows of a staged tile

// Forward shared memory: Q | K, V double-buffered, (kTile, D + 8) bf16 each | segment ids of the
// query rows and of both key buffers.
template <int D>
inline size_t forward_smem_bytes() {
  return 5 * size_t(kTile) * tile_stride<D>() * sizeof(bf16) + 3 * kTile * sizeof(int);
}

// Backward shared memory, both kernels: six (kTile, D + 8) bf16 tiles (the two the block keeps, the two
// it streams, double-buffered) | lse (log2 domain) and delta of the streamed query rows, f32,
// double-buffered (dK/dV kernel) | segment ids of the kept rows and of both streamed buffers.
template <int D>
inline size_t backward_smem_bytes() {
  return 6 * size_t(kTile) * tile_stride<D>() * sizeof(bf16) + 4 * kTile * sizeof(float) +
         3 * kTile * sizeof(int);
}

// ---- PTX wrappers -------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives it.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c (16 x 8) += a (16 x 16) * b (16 x 8)
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c0, c1 (two 16 x 8 tiles side by side) += a (16 x 16) * b (16 x 16), b from one ldmatrix x4:
// registers 0, 1 the first 8 columns, 2, 3 the next.
__device__ __forceinline__ void mma_16x16x16(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[4]) {
  mma_16x8x16(c0, a, b[0], b[1]);
  mma_16x8x16(c1, a, b[2], b[3]);
}

// Two floats as bf16x2, the lower column in the low half (the fragment order).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- fragment addresses in a staged tile (row stride `stride` elements) -------------------------
// Rows [r0, r0 + 16) x columns [c0, c0 + 16): without .trans the A fragment of those rows; with
// .trans, for a tile stored [k][n], the B fragments (b0, b1) of n-tiles c0 and c0 + 8.
__device__ __forceinline__ const bf16* rows16_address(const bf16* tile, int stride, int r0, int c0) {
  const int lane = threadIdx.x & 31;
  return tile + (r0 + (lane & 15)) * stride + c0 + (lane >> 4) * 8;
}
// For a tile stored [n][k]: the B fragments (b0, b1) of n-tiles n0 and n0 + 8 over k [k0, k0 + 16).
__device__ __forceinline__ const bf16* cols16_address(const bf16* tile, int stride, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  return tile + (n0 + (lane >> 4) * 8 + (lane & 7)) * stride + k0 + ((lane >> 3) & 1) * 8;
}

// ---- warp-level products ------------------------------------------------------------------------
// acc (16 x 8 NT) += A B^T over K columns: A rows [a_row0, a_row0 + 16) of tile `a`, B rows
// [b_row0, b_row0 + 8 NT) of tile `b` (both stored row major, K = contraction length).
template <int K, int NT>
__device__ __forceinline__ void mma_a_bt(float (&acc)[NT][4], const bf16* a, int a_row0, const bf16* b,
                                         int b_row0, int stride) {
  static_assert(NT % 2 == 0 && K % 16 == 0);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[4];
    ldsm_x4(af, rows16_address(a, stride, a_row0, kk * 16));
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bf[4];
      ldsm_x4(bf, cols16_address(b, stride, b_row0 + np * 16, kk * 16));
      mma_16x16x16(acc[2 * np], acc[2 * np + 1], af, bf);
    }
  }
}

// acc (16 x D) += P B, P (16 x 8 NP) held as C fragments (rounded to bf16 here), B rows
// [b_row0, b_row0 + 8 NP) x D columns of tile `b` (stored row major: [k][n]).
template <int D, int NP>
__device__ __forceinline__ void mma_c_b(float (&acc)[D / 8][4], const float (&p)[NP][4], const bf16* b,
                                        int b_row0, int stride) {
  static_assert(NP % 2 == 0 && D % 16 == 0);
#pragma unroll
  for (int kk = 0; kk < NP / 2; ++kk) {
    const uint32_t af[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]), pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                            pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                            pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bf[4];
      ldsm_x4_trans(bf, rows16_address(b, stride, b_row0 + kk * 16, dp * 16));
      mma_16x16x16(acc[2 * dp], acc[2 * dp + 1], af, bf);
    }
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
}

// ---- per-tile softmax and row stores, shared with the wgmma kernels (attention_wgmma.cuh) --------
// Both families hold a warp's 16 rows of an accumulator the same way: this lane has rows r_lo
// (entries 0, 1) and r_lo + 8 (entries 2, 3) of each 8-column block.

// Runs body(nt, e, attends) over this lane's entries of NT 8-column blocks (4 entries each), where
// attends says whether the entry's (query, key) pair attends: attends_at(nt, e) on a tile that needs
// the mask (the diagonal, the end of the row, document edges), true elsewhere, so the common tile
// runs no per-entry test at all.
template <int NT = kTile / 8, typename Body, typename AttendsAt>
__device__ __forceinline__ void for_each_entry(bool masked, Body body, AttendsAt attends_at) {
  if (masked) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) body(nt, e, attends_at(nt, e));
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) body(nt, e, true);
  }
}

// The mask of for_each_entry for a tile whose rows are queries and whose columns are keys (S, dP):
// this lane's rows q0 + r_lo (entries 0, 1) and + 8 (2, 3), columns k0 + nt * 8 + 2 (lane & 3) (+ 1).
struct QueryRowsMask {
  int q0, k0, T, r_lo;
  const int* seg_q;  // the query tile's segment ids
  const int* seg_k;  // the key tile's
  __device__ __forceinline__ bool operator()(int nt, int e) const {
    const int rr = r_lo + (e >> 1) * 8, cc = nt * 8 + 2 * (threadIdx.x & 3) + (e & 1);
    return attention::attends(q0 + rr, k0 + cc, T, seg_q[rr], seg_k[cc]);
  }
};
// The same for the transposed tiles of the dK/dV kernels (S^T, dP^T): rows are keys k0 + r_lo (+ 8),
// columns queries q0 + col0 + nt * 8 + 2 (lane & 3) (+ 1), col0 the start of a chunk of the tile.
struct KeyRowsMask {
  int q0, k0, T, r_lo, col0;
  const int* seg_q;
  const int* seg_k;
  __device__ __forceinline__ bool operator()(int nt, int e) const {
    const int kr = r_lo + (e >> 1) * 8, qc = col0 + nt * 8 + 2 * (threadIdx.x & 3) + (e & 1);
    return attention::attends(q0 + qc, k0 + kr, T, seg_q[qc], seg_k[kr]);
  }
};

// The forward's online softmax over one 64-key tile (log2 domain: m holds scaled maxima, P = 2^(S *
// scale_log2 - m) with one FMA an entry). sc: this warp's raw scores in,
// P out (f32); o, m, l: the output rows, running maxima and this lane's share of the row sums,
// rescaled to the new maxima. exp2_fn: exp2f (mma.sync) or exp2_ftz (wgmma).
template <int D, typename Exp2>
__device__ __forceinline__ void online_softmax_tile(float (&sc)[kTile / 8][4], float (&o)[D / 8][4], float (&m)[2],
                                                    float (&l)[2], bool masked, int q0, int k0, int T,
                                                    const int* seg_q, const int* seg_k, int r_lo, float scale_log2,
                                                    Exp2 exp2_fn) {
  float tile_max[2] = {-INFINITY, -INFINITY};
  for_each_entry(
      masked,
      [&](int nt, int e, bool attends) {  // raw scores: scaling (by a positive factor) keeps the maximum
        const float x = attends ? sc[nt][e] : -INFINITY;
        sc[nt][e] = x;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], x);
      },
      QueryRowsMask{q0, k0, T, r_lo, seg_q, seg_k});
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float m_new = fmaxf(m[r], tile_max[r] * scale_log2);
    base[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with no key so far: exp2(-inf) = 0
    const float alpha = exp2_fn(m[r] - base[r]);
    m[r] = m_new;
    l[r] *= alpha;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][2 * r] *= alpha;
      o[dt][2 * r + 1] *= alpha;
    }
  }
#pragma unroll
  for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2_fn(fmaf(sc[nt][e], scale_log2, -base[e >> 1]));
      sc[nt][e] = p;
      l[e >> 1] += p;
    }
}

// Row r (0: r_lo, 1: r_lo + 8) of acc (16 x D), times `scale`, as bf16 at dst (the row's first element).
template <int D>
__device__ __forceinline__ void store_row(bf16* dst, const float (&acc)[D / 8][4], int r, float scale) {
  dst += 2 * (threadIdx.x & 3);
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
    *reinterpret_cast<uint32_t*>(dst + dt * 8) = pack_bf16x2(acc[dt][2 * r] * scale, acc[dt][2 * r + 1] * scale);
}

// The forward's end for this lane's rows of query tile q0 of head h, row b: the quad's row sums
// added, out = O / l (bf16), lse = natural-log row logsumexp (-inf for a row that attends to nothing).
template <int D>
__device__ __forceinline__ void store_forward_rows(bf16* out, float* lse, const float (&o)[D / 8][4], const float (&m)[2],
                                                   float (&l)[2], const attention::Shape& s, int b, int h, int q0,
                                                   int r_lo) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int i = q0 + r_lo + 8 * r;
    if (i >= s.T) continue;
    store_row<D>(out + (int64_t(b) * s.T + i) * s.Hq * D + int64_t(h) * D, o, r, l[r] > 0.f ? 1.f / l[r] : 0.f);
    if ((threadIdx.x & 3) == 0)
      lse[(int64_t(b) * s.Hq + h) * s.T + i] = l[r] > 0.f ? (m[r] + log2f(l[r])) * attention::kLn2 : -INFINITY;
  }
}

// The dK/dV kernel's end: this lane's rows of key tile k0 of kv head g, row b, into dqkv (B,T,Htot,D):
// dK = scale * dk, dV = dv.
template <int D>
__device__ __forceinline__ void store_key_rows(bf16* dqkv, const float (&dk)[D / 8][4], const float (&dv)[D / 8][4],
                                               const attention::Shape& s, int b, int g, int k0, int r_lo, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = k0 + r_lo + 8 * r;
    if (j >= s.T) continue;
    bf16* dk_row = dqkv + (int64_t(b) * s.T + j) * s.Htot() * D + int64_t(s.Hq + g) * D;
    store_row<D>(dk_row, dk, r, scale);
    store_row<D>(dk_row + int64_t(s.Hkv) * D, dv, r, 1.f);
  }
}

// The dQ kernel's end: this lane's rows of query tile q0 of head h, row b: dQ = scale * dq.
template <int D>
__device__ __forceinline__ void store_query_rows(bf16* dqkv, const float (&dq)[D / 8][4], const attention::Shape& s,
                                                 int b, int h, int q0, int r_lo, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = q0 + r_lo + 8 * r;
    if (i < s.T) store_row<D>(dqkv + (int64_t(b) * s.T + i) * s.Htot() * D + int64_t(h) * D, dq, r, scale);
  }
}

// ---- staging ------------------------------------------------------------------------------------
// cp.async (sm_80+): the copies land in shared memory without passing through registers and
// complete at cp_async_wait, so a block fetches its next tile while it computes on the current one.

// 16 bytes from src to dst; with valid false, 16 zero bytes (a 0-byte source read).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
// Token rows [row0, row0 + kTile) of one head (D elements at `base`, tokens `row_stride` apart)
// -> tile (kTile, D + 8), as cp.async copies of this thread's share; rows at or past T are zero.
// base and row_stride keep 16-byte alignment.
template <int D>
__device__ __forceinline__ void stage_tile_async(bf16* tile, const bf16* base, int64_t row_stride, int row0, int T) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < kTile * kChunks; e += kThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const bool in = row0 + r < T;
    cp_async_16(tile + r * tile_stride<D>() + c, in ? base + int64_t(row0 + r) * row_stride + c : base, in);
  }
}

// Segment ids of rows [row0, row0 + kTile) into ids (0 without segments or past T).
__device__ __forceinline__ void stage_ids(int* ids, const int32_t* seg_row, int row0, int T) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) ids[r] = seg_row && row0 + r < T ? seg_row[row0 + r] : 0;
}

// lse (log2 domain) and delta of query rows [q0, q0 + kTile) of one head (lse_h, delta_h: its (T)
// rows) into lse_s, delta_s; 0 past T. The dK/dV kernels stage them with each query tile.
__device__ __forceinline__ void stage_row_stats(float* lse_s, float* delta_s, const float* lse_h,
                                                const float* delta_h, int q0, int T) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    const bool in = q0 + r < T;
    lse_s[r] = in ? lse_h[q0 + r] * attention::kLog2e : 0.f;
    delta_s[r] = in ? delta_h[q0 + r] : 0.f;
  }
}

// The same for this lane's two query rows (r_lo, r_lo + 8) of query tile q0 of head h, row b, into
// registers: the dQ kernels keep their rows' stats for the whole block.
__device__ __forceinline__ void load_row_stats(float (&row_lse)[2], float (&row_delta)[2], const float* lse,
                                               const float* delta, const attention::Shape& s, int b, int h, int q0,
                                               int r_lo) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = q0 + r_lo + 8 * r;
    const int64_t at = (int64_t(b) * s.Hq + h) * s.T + i;
    row_lse[r] = i < s.T ? lse[at] * attention::kLog2e : 0.f;
    row_delta[r] = i < s.T ? delta[at] : 0.f;
  }
}

// Which (tile, head, row) a block of a (tiles, heads, rows) grid takes, walking the grid tile-major:
// the hardware starts blocks in linear order (x fastest), so the grid's first blocks take tile 0 of
// every head and row, the last ones the last tile of each. Callers map tile 0 to their longest work
// (the dK/dV kernels' first key tile meets every query tile; the query-tile kernels reverse it), so
// the long blocks start first and the short ones fill the tail. Walking x (the tile) fastest instead
// starts the long blocks of the last (head, row) in the final wave: in a list-scheduling model of
// Llama-3.2-1B's dK/dV grid at 3 blocks an SM, a tail of 23% of the ideal time against 3% this way.
struct TileBlock {
  int tile, head, row;
};
__device__ __forceinline__ TileBlock tile_major_block() {
  const int heads_rows = int(gridDim.y * gridDim.z);
  const int linear = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int rest = linear % heads_rows;
  return {linear / heads_rows, rest % int(gridDim.y), rest / int(gridDim.y)};
}

// Row b's part of the kernels' inputs: its tokens of qkv (T, Htot, D), its segment ids (T) and its
// tile ranges (n_tiles), the last two null when absent.
struct RowInputs {
  const bf16* qkv;
  const int32_t* segment_ids;
  const uint2* ranges;
};
template <int D>
__device__ __forceinline__ RowInputs row_inputs(const bf16* qkv, const int32_t* segment_ids, const uint2* tile_ranges,
                                                const attention::Shape& s, int b, int n_tiles) {
  return {qkv + int64_t(b) * s.T * s.Htot() * D, segment_ids ? segment_ids + int64_t(b) * s.T : nullptr,
          tile_ranges ? tile_ranges + int64_t(b) * n_tiles : nullptr};
}

// Whether query tile qt and key tile kt of one row can share a segment id (ranges: that row's
// (min, max) per tile, or null without segments).
__device__ __forceinline__ bool tiles_meet(const uint2* ranges, int qt, int kt) {
  if (!ranges) return true;
  const uint2 q = ranges[qt], k = ranges[kt];
  return q.x <= k.y && k.x <= q.y;
}

// The first tile after `t` and at most `last` that meets tile `other`; last + 1 if none.
__device__ __forceinline__ int next_meeting(const uint2* ranges, int other, int t, int last) {
  for (++t; t <= last && !tiles_meet(ranges, other, t); ++t) {
  }
  return t;
}

// How the mma.sync kernels stage a tile: rows of D + 8 bf16 (stage_tile_async), read with ldmatrix
// through the generic proxy, so the barrier alone publishes them. The wgmma kernels' swizzled
// layout (attention_wgmma.cuh, SwizzledTiles) is the other.
template <int D>
struct PaddedTiles {
  static constexpr int kElems = kTile * tile_stride<D>();  // bf16 elements a tile takes
  static __device__ __forceinline__ void stage(bf16* tile, const bf16* base, int64_t row_stride, int row0, int T) {
    stage_tile_async<D>(tile, base, row_stride, row0, T);
  }
  static __device__ __forceinline__ void publish() {}  // before the barrier that publishes a tile
};

// The K and V tiles (with their segment ids) that meet query tile qt, streamed through two
// buffers: the forward and dQ kernels of both families share it. Buffers: K, V [2][Tiles::kElems]
// bf16, ids [2][kTile]. Usage: kt = start(); then per tile next = wait_and_prefetch(kt, buf),
// compute on buffer buf, __syncthreads(), kt = next and buf ^= 1, while kt <= qt.
template <int D, class Tiles = PaddedTiles<D>>
struct KeyTileStream {
  bf16* K_buf;
  bf16* V_buf;
  int* ids_buf;
  const bf16* k_head;  // this block's kv head in row b of qkv: token t at k_head + t * row_stride
  const bf16* v_head;
  int64_t row_stride;
  const int32_t* seg_row;  // row b's segment ids, or null
  int T;
  const uint2* ranges;     // row b's tile ranges, or null
  int qt;                  // the query tile; key tiles past it are never needed (causal)

  // Starts the copies of key tile kt into buffer buf, as one cp.async group.
  __device__ __forceinline__ void fetch(int kt, int buf) const {
    Tiles::stage(K(buf), k_head, row_stride, kt * kTile, T);
    Tiles::stage(V(buf), v_head, row_stride, kt * kTile, T);
    stage_ids(ids_buf + buf * kTile, seg_row, kt * kTile, T);
    cp_async_commit();
  }
  // The first key tile, started into buffer 0 (<= qt: a tile meets itself).
  __device__ __forceinline__ int start() const {
    const int kt = next_meeting(ranges, qt, -1, qt);
    fetch(kt, 0);
    return kt;
  }
  // Starts the next key tile that meets the query tile into the other buffer, then waits until
  // tile kt (in buffer buf, with whatever was committed alongside it) is visible to every warp
  // (and, for Tiles that need it, to the tensor cores).
  // Returns the next tile, qt + 1 when there is none; the same for the whole block.
  __device__ __forceinline__ int wait_and_prefetch(int kt, int buf) const {
    const int next = next_meeting(ranges, qt, kt, qt);
    if (next <= qt) {
      fetch(next, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    Tiles::publish();
    __syncthreads();
    return next;
  }
  __device__ __forceinline__ bf16* K(int buf) const { return K_buf + buf * Tiles::kElems; }
  __device__ __forceinline__ bf16* V(int buf) const { return V_buf + buf * Tiles::kElems; }
  __device__ __forceinline__ const int* ids(int buf) const { return ids_buf + buf * kTile; }
};

// ranges (B, ceil(T / kTile)) = per tile of each row, (min, max) of its tokens' segment ids read as
// uint32: an order-preserving relabelling, so the overlap test stays exact for any ids, and the
// loader's padding id -1 sorts after every document. (As signed ids, the tile where the last
// document meets the padding would span [-1, last] and meet every tile before it.)
// With short_token (B, T), only the tokens marked 1 count (attention_documents.h: the rest belong
// to cuDNN); a tile without any has the empty range (0xffffffff, 0), and its block leaves at once
// without writing (as a key tile it can still meet a query range spanning every id, which the
// element mask then settles).
void tile_segment_ranges(CudaState& state, uint2* ranges, const int32_t* segment_ids,
                         const uint8_t* short_token, int B, int T);

// Whether the block of tile t has nothing to do (only with a token subset: see above).
__device__ __forceinline__ bool tile_is_empty(const uint2* ranges, int t) {
  return ranges && ranges[t].x > ranges[t].y;
}

}  // namespace ingot::cuda::attention_mma
