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
using attention_mma::KeyTileStream;
using attention_mma::online_softmax_tile;
using attention_mma::row_inputs;
using attention_mma::stage_ids;
using attention_mma::store_forward_rows;
using attention_mma::tile_is_empty;
using attention_mma::tile_major_block;
using attention_mma::TileBlock;
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
  const TileBlock block = tile_major_block();
  const int qt = n_tiles - 1 - block.tile;  // longest rows first: the grid's tail is short work
  const int h = block.head, b = block.row, g = h / (s.Hq / s.Hkv);
  const int T = s.T, q0 = qt * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row_stride = int64_t(s.Htot()) * D;
  const auto [batch, seg_row, ranges] = row_inputs<D>(qkv, segment_ids, tile_ranges, s, b, n_tiles);
  if (tile_is_empty(ranges, qt)) return;
  const KeyTileStream<D, SwizzledTiles<D>> keys{reinterpret_cast<bf16*>(K_buf), reinterpret_cast<bf16*>(V_buf),
                                                 seg_k_buf, batch + int64_t(s.Hq + g) * D,
                                                 batch + int64_t(s.Hq + s.Hkv + g) * D, row_stride, seg_row, T,
                                                 ranges, qt};

  stage_tile_async<D>(Qs, batch + int64_t(h) * D, row_stride, q0, T);  // lands with the first keys
  stage_ids(seg_q, seg_row, q0, T);
  int kt = keys.start();

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
    const int next = keys.wait_and_prefetch(kt, buf);  // tile kt (and Q) visible to warps and tensor cores
    const int k0 = kt * kTile;
    const uint64_t k_desc = in_buffer(k_desc0, buf, kTileBytes), v_desc = in_buffer(v_desc0, buf, kTileBytes);
    const int* seg_k = seg_k_buf + buf * kTile;

    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_ss(sc, k_step(q_desc, kk), k_step(k_desc, kk), kk);  // S = Q K^T
    wgmma_commit();
    wgmma_wait<0>();

    const bool masked = seg_row || kt == qt || k0 + kTile > T;
    online_softmax_tile<D>(sc, o, m, l, masked, q0, k0, T, seg_q, seg_k, r_lo, scale_log2, exp2_ftz);

    wgmma_rs_tile(o, sc, v_desc);  // O += P V
    wgmma_wait<0>();
    __syncthreads();  // every warp is done with this buffer before it is refilled
    kt = next;
  }

  store_forward_rows<D>(out, lse, o, m, l, s, b, h, q0, r_lo);
#else
  __trap();  // launched only where sm_90a code was loaded (attention_wgmma_takes)
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
