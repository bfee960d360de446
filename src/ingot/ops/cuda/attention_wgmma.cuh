// Hopper (sm_90a) pieces of the tensor-core attention (attention_wgmma_forward.cu,
// attention_wgmma_backward.cu): the warpgroup MMA (wgmma) and the shared-memory layout it reads.
// D = 64 or 128.
//
// Tiles: 64 tokens x D bf16 (one head), stored as D / 64 column halves of 64 tokens x 64 bf16 (128-byte
// rows, 8 KiB each), 1024-byte aligned, in the 128-byte swizzle of the PTX ISA ("Shared Memory Matrix
// Layout"): in a half, the 16-byte chunk c of row r sits at byte r * 128 + ((c ^ (r % 8)) * 16). One
// such tile serves both ways a product reads it:
//   - K-major (the contraction runs along D): S = Q K^T reads Q and K this way;
//   - MN-major (the contraction runs along the tokens): O += P V reads V, dV += P^T dO reads dO this way.
// Descriptors (64-bit; start address, leading and stride byte offsets, all >> 4; swizzle mode 1
// in bits 62-63): K-major steps of 16 along D move the start by 32 bytes inside a half (and to the
// next half after four), 8-row groups are 1024 bytes apart (stride offset), the leading offset is
// unused; MN-major steps of 16 tokens move the start by 2048 bytes, 8-token groups are 1024 bytes
// apart, and the leading offset is the distance to the next 64 columns: the next half.
//
// Register fragments (per warp w of the warpgroup, rows 16 w .. 16 w + 15; lane = 4 r + c): the
// accumulator of m64nNk16 holds, for each 8-column block j, d[j][0..1] at row r, columns 8 j + 2 c,
// + 1, and d[j][2..3] at row r + 8: the mma.sync C layout of attention_mma.cuh, block by block. A
// from registers has the mma.sync A layout, so an accumulator rounded to bf16 feeds the next
// product directly (P^T into dV += P^T dO, dS^T into dK += dS^T Q, dS into dQ += dS K).
#pragma once
#include "ingot/ops/cuda/attention_mma.cuh"

namespace ingot::cuda::attention_wgmma {

using attention_mma::kThreads;
using attention_mma::kTile;
using attention_mma::pack_bf16x2;
using attention_mma::smem_u32;

constexpr int kRowBytes = 128;                   // a row of a half: 64 bf16
constexpr int kHalfBytes = kTile * kRowBytes;    // 8 KiB
constexpr int kAtomBytes = 8 * kRowBytes;        // the swizzle's repeating 8 rows
template <int D>
constexpr int tile_bytes() { return kTile * D * 2; }

// A 128-byte-swizzled operand at shared address `addr`; lbo and sbo in bytes.
__device__ __forceinline__ uint64_t descriptor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(1) << 62);
}
// A tile's descriptors, built once: the base (start address at the tile's first byte), then per
// step a constant added to it. The start-address field is the low 14 bits of (address >> 4) and
// never carries: shared addresses stay below 256 KiB.
__device__ __forceinline__ uint64_t k_major_base(uint32_t tile) { return descriptor(tile, 16, kAtomBytes); }
__device__ __forceinline__ uint64_t mn_major_base(uint32_t tile) { return descriptor(tile, kHalfBytes, kAtomBytes); }
// Read K-major (contraction along D): columns [16 kk, 16 kk + 16).
__device__ __forceinline__ uint64_t k_step(uint64_t base, int kk) {
  return base + uint64_t(((kk >> 2) * kHalfBytes + (kk & 3) * 32) >> 4);
}
// Read MN-major (contraction along the tile's rows): rows [16 kk, 16 kk + 16), all D columns.
__device__ __forceinline__ uint64_t mn_step(uint64_t base, int kk) { return base + uint64_t(kk * 16 * kRowBytes >> 4); }
// The same descriptor moved to buffer `buf` of a double-buffered pair of tiles of `bytes` each.
__device__ __forceinline__ uint64_t in_buffer(uint64_t base, int buf, int bytes) {
  return base + uint64_t(buf * (bytes >> 4));
}

// 2^x with results below 2^-126 flushed to zero: one MUFU.EX2 (exp2f adds range handling for
// subnormal results, which an attention probability has no use for).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Whether query tile qt and key tile kt hold one and the same segment id throughout (ranges over
// every token, as the backward's): the element mask then matters only on the diagonal and past T.
__device__ __forceinline__ bool tiles_one_document(const uint2* ranges, int qt, int kt) {
  if (!ranges) return false;
  const uint2 q = ranges[qt], k = ranges[kt];
  return q.x == q.y && k.x == k.y && q.x == k.x;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written through the generic proxy (cp.async, plain stores) that wgmma reads next:
// each writing thread fences before the barrier that publishes it.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Accumulator operands of m64nNk16, d[N / 8][4] in fragment order (N = 64: 32 registers; 128: 64).
#define INGOT_WGMMA_D32 \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])
#define INGOT_WGMMA_ACC32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define INGOT_WGMMA_D64 \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
      "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), \
      "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
      "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define INGOT_WGMMA_ACC64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, " \
  "%59, %60, %61, %62, %63}"

// d (64 x 64, f32) (+)= A (64 x 16) B (16 x 64), A and B K-major in shared memory; accumulate 0
// overwrites d. Asynchronous, as every wgmma here: fence before, commit and wait after.
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], uint64_t a, uint64_t b, int accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " INGOT_WGMMA_ACC32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : INGOT_WGMMA_D32
      : "l"(a), "l"(b), "r"(accumulate));
#endif
}

// d (64 x N, f32) += A (64 x 16, registers) B (16 x N), B MN-major in shared memory; N = 64 or 128.
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " INGOT_WGMMA_ACC32
      ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : INGOT_WGMMA_D32
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#endif
}
__device__ __forceinline__ void wgmma_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " INGOT_WGMMA_ACC64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : INGOT_WGMMA_D64
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#endif
}
#undef INGOT_WGMMA_D32
#undef INGOT_WGMMA_ACC32
#undef INGOT_WGMMA_D64
#undef INGOT_WGMMA_ACC64

// The A fragment of columns [16 kk, 16 kk + 16) of an accumulator, rounded to bf16.
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const float (&d)[8][4], int kk) {
  a[0] = pack_bf16x2(d[2 * kk][0], d[2 * kk][1]);
  a[1] = pack_bf16x2(d[2 * kk][2], d[2 * kk][3]);
  a[2] = pack_bf16x2(d[2 * kk + 1][0], d[2 * kk + 1][1]);
  a[3] = pack_bf16x2(d[2 * kk + 1][2], d[2 * kk + 1][3]);
}

// P (64 x 64, an accumulator) as the four A fragments of a 64-token contraction, rounded to bf16.
using TileFragments = uint32_t[kTile / 16][4];
__device__ __forceinline__ void tile_fragments(TileFragments& a, const float (&p)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) a_fragment(a[kk], p, kk);
}
// acc (64 x N) += A B, B the tile's rows MN-major from descriptor b. Call between fence and commit.
template <int NT>
__device__ __forceinline__ void wgmma_rs_steps(float (&acc)[NT][4], const TileFragments& a, uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) wgmma_rs(acc, a[kk], mn_step(b, kk));
}

// acc (64 x N) += P B for one 64-token tile: P rounded to bf16 here, B MN-major from descriptor b.
// The A fragments are packed before the fence, so no register the tensor cores read is written
// after it. Commits the group (the caller waits).
template <int NT>
__device__ __forceinline__ void wgmma_rs_tile(float (&acc)[NT][4], const float (&p)[8][4], uint64_t b) {
  TileFragments a;
  tile_fragments(a, p);
  wgmma_fence();
  wgmma_rs_steps(acc, a, b);
  wgmma_commit();
}
// Two such products in one commit group: acc1 += P1 B1, acc2 += P2 B2. Both P are packed first, so
// their f32 registers are free while the tensor cores run.
template <int NT>
__device__ __forceinline__ void wgmma_rs_tile2(float (&acc1)[NT][4], const float (&p1)[8][4], uint64_t b1,
                                               float (&acc2)[NT][4], const float (&p2)[8][4], uint64_t b2) {
  TileFragments a1, a2;
  tile_fragments(a1, p1);
  tile_fragments(a2, p2);
  wgmma_fence();
  wgmma_rs_steps(acc1, a1, b1);
  wgmma_rs_steps(acc2, a2, b2);
  wgmma_commit();
}

// Token rows [row0, row0 + kTile) of one head (D bf16 at `base`, tokens `row_stride` apart) -> the
// swizzled tile at `tile`, as cp.async copies of this thread's share; rows at or past T are zero.
template <int D>
__device__ __forceinline__ void stage_tile_async(unsigned char* tile, const bf16* base, int64_t row_stride,
                                                 int row0, int T) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < kTile * kChunks; e += kThreads) {
    const int r = e / kChunks, c = e % kChunks;
    const bool in = row0 + r < T;
    attention_mma::cp_async_16(tile + (c >> 3) * kHalfBytes + r * kRowBytes + (((c & 7) ^ (r & 7)) << 4),
                               in ? base + int64_t(row0 + r) * row_stride + c * 8 : base, in);
  }
}

// The swizzled layout as a KeyTileStream policy (attention_mma.cuh): tiles of tile_bytes<D>() that
// the tensor cores read, so each thread fences its cp.async writes before the publishing barrier.
template <int D>
struct SwizzledTiles {
  static constexpr int kElems = kTile * D;  // bf16 elements a tile takes
  static __device__ __forceinline__ void stage(bf16* tile, const bf16* base, int64_t row_stride, int row0, int T) {
    stage_tile_async<D>(reinterpret_cast<unsigned char*>(tile), base, row_stride, row0, T);
  }
  static __device__ __forceinline__ void publish() { fence_async_shared(); }
};

}  // namespace ingot::cuda::attention_wgmma

namespace ingot::cuda {

// Whether the driver loaded sm_90a code (with wgmma) for these kernels on this device: a one-block
// probe, run once when the CUDA state is created (CudaState::wgmma_code). False on any other GPU
// or where CMAKE_CUDA_ARCHITECTURES built no sm_90a code; then the kernels are never launched.
bool attention_wgmma_code_loaded(cudaStream_t stream);
// Whether the wgmma kernels take head dim D: sm_90a code loaded, D = 64 or 128, and
// INGOT_ATTENTION_MMA_SYNC unset (that variable keeps the mma.sync kernels, for A/B runs).
bool attention_wgmma_takes(const CudaState& state, int D);
// The forward of attention_wgmma_forward.cu (ranges: attention_mma_forward's tile ranges, or null).
void attention_wgmma_forward(CudaState& state, bf16* out, float* lse, const bf16* qkv, const int32_t* segment_ids,
                             const uint2* ranges, const attention::Shape& s, double scale);
// Steps 2 and 3 of attention_wgmma_backward.cu; delta and the tile ranges (or null) come from
// attention_mma_backward, which launches this.
void attention_wgmma_backward(CudaState& state, bf16* dqkv, const bf16* dout, const float* lse, const float* delta,
                              const bf16* qkv, const int32_t* segment_ids, const uint2* ranges,
                              const attention::Shape& s, double scale);
// Records the kernels a tensor-core call took, for attention_mma_kernels() (attention_mma.h).
void attention_set_mma_kernels(const char* kernels);

}  // namespace ingot::cuda
