// Causal GQA attention forward on tensor cores: out (B,T,Hq,D) bf16 and lse (B,Hq,T) f32 from
// packed qkv (B,T,Htot,D) bf16, optional segment_ids (B,T). Layout, fragments and tile skipping:
// attention_mma.cuh; dispatch: attention_mma.h.
// One block per (query tile, query head, batch), the longest rows first. Each warp owns 16 query
// rows and streams the key tiles up to the diagonal that share a document with its tile:
// S = Q K^T on tensor cores, online softmax in the log2 domain, O += P V with P rounded to bf16
// (as flash attention does; the row sums use the f32 values), normalised once at the end.
#include <cmath>

#include "ingot/ops/cuda/attention_cudnn.h"
#include "ingot/ops/cuda/attention_mma.cuh"
#include "ingot/ops/cuda/attention_mma.h"
#include "ingot/ops/cuda/attention_wgmma.cuh"

namespace ingot::cuda {

namespace attention_mma {

__global__ void tile_segment_ranges_kernel(uint2* ranges, const int32_t* segment_ids,
                                           const uint8_t* short_token, int B, int T) {
  const int n_tiles = (T + kTile - 1) / kTile;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < int64_t(B) * n_tiles;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int b = int(idx / n_tiles), t0 = int(idx % n_tiles) * kTile, t1 = min(T, t0 + kTile);
    const int32_t* row = segment_ids + int64_t(b) * T;
    const uint8_t* mine = short_token ? short_token + int64_t(b) * T : nullptr;
    uint32_t lo = 0xffffffffu, hi = 0;  // empty until a token of this tile counts
    for (int t = t0; t < t1; ++t) {
      if (mine && !mine[t]) continue;
      lo = min(lo, uint32_t(row[t]));
      hi = max(hi, uint32_t(row[t]));
    }
    ranges[idx] = make_uint2(lo, hi);
  }
}

void tile_segment_ranges(CudaState& state, uint2* ranges, const int32_t* segment_ids,
                         const uint8_t* short_token, int B, int T) {
  const int64_t n = int64_t(B) * ceil_div(T, kTile);
  tile_segment_ranges_kernel<<<grid_for(n, 256, state), 256, 0, state.stream>>>(ranges, segment_ids,
                                                                                short_token, B, T);
  INGOT_LAUNCH_CHECK("tile_segment_ranges_kernel");
}

}  // namespace attention_mma

namespace {

using namespace attention_mma;
using attention::Shape;

template <int D>
__global__ void __launch_bounds__(kThreads)
    mma_attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* segment_ids,
                                 const uint2* tile_ranges, Shape s, float scale_log2) {
  constexpr int kS = tile_stride<D>();
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* K_buf = Qs + kTile * kS;       // [2][kTile * kS]
  bf16* V_buf = K_buf + 2 * kTile * kS;  // [2][kTile * kS]
  int* seg_q = reinterpret_cast<int*>(V_buf + 2 * kTile * kS);
  int* seg_k_buf = seg_q + kTile;  // [2][kTile]

  const int n_tiles = int(gridDim.x);
  const TileBlock block = tile_major_block();
  const int qt = n_tiles - 1 - block.tile;  // longest rows first: the grid's tail is short work
  const int h = block.head, b = block.row, g = h / (s.Hq / s.Hkv);
  const int T = s.T, q0 = qt * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row_stride = int64_t(s.Htot()) * D;
  const auto [batch, seg_row, ranges] = row_inputs<D>(qkv, segment_ids, tile_ranges, s, b, n_tiles);
  if (tile_is_empty(ranges, qt)) return;
  const KeyTileStream<D> keys{K_buf, V_buf, seg_k_buf, batch + int64_t(s.Hq + g) * D,
                              batch + int64_t(s.Hq + s.Hkv + g) * D, row_stride, seg_row, T, ranges, qt};

  stage_tile_async<D>(Qs, batch + int64_t(h) * D, row_stride, q0, T);  // lands with the first keys
  stage_ids(seg_q, seg_row, q0, T);
  int kt = keys.start();

  // This lane's query rows within the tile: r_lo (C fragment entries 0, 1) and r_lo + 8 (2, 3).
  const int r_lo = warp * 16 + (lane >> 2);
  float o[D / 8][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // this lane's share of each row sum; the quad's shares add up at the end

  for (int buf = 0; kt <= qt; buf ^= 1) {
    const int next = keys.wait_and_prefetch(kt, buf);  // tile kt (and Q) visible to every warp
    const int k0 = kt * kTile;
    const bf16* Ks = keys.K(buf);
    const bf16* Vs = keys.V(buf);
    const int* seg_k = keys.ids(buf);

    float sc[kTile / 8][4];  // scores of rows r_lo, r_lo + 8 against the tile's 64 keys
    zero(sc);
    mma_a_bt<D, kTile / 8>(sc, Qs, warp * 16, Ks, 0, kS);

    const bool masked = seg_row || kt == qt || k0 + kTile > T;
    online_softmax_tile<D>(sc, o, m, l, masked, q0, k0, T, seg_q, seg_k, r_lo, scale_log2,
                           [](float x) { return exp2f(x); });
    mma_c_b<D, kTile / 8>(o, sc, Vs, 0, kS);
    __syncthreads();  // every warp is done with this buffer before it is refilled
    kt = next;
  }

  store_forward_rows<D>(out, lse, o, m, l, s, b, h, q0, r_lo);
}

template <int D>
void launch_forward(CudaState& state, Tensor out, Tensor lse, Tensor qkv, const int32_t* segment_ids,
                    const uint2* ranges, const Shape& s, double scale) {
  const size_t smem = forward_smem_bytes<D>();
  auto kernel = mma_attention_forward_kernel<D>;
  INGOT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned(ceil_div(s.T, kTile)), unsigned(s.Hq), unsigned(s.B));
  kernel<<<grid, kThreads, smem, state.stream>>>(out.ptr<bf16>(), lse.ptr<float>(), qkv.ptr<bf16>(),
                                                 segment_ids, ranges, s,
                                                 float(scale) * attention::kLog2e);
  INGOT_LAUNCH_CHECK("mma_attention_forward_kernel");
}

}  // namespace

bool attention_mma_supports(Context& ctx, const Tensor& qkv, int n_q_heads, bool backward) {
  if (attention_mode() == AttentionMode::kernels) return false;
  const int64_t D = qkv.dim(3);
  if (qkv.dtype != DType::bf16 || !attention_mma_takes_shapes(qkv.dim(0), n_q_heads, D) || !aligned16(qkv.data))
    return false;
  // The D = 128 backward's tiles (104 KiB) exceed what sm_86/sm_89 give a block; its forward fits.
  const size_t smem = backward ? (D == 64 ? backward_smem_bytes<64>() : backward_smem_bytes<128>())
                               : (D == 64 ? forward_smem_bytes<64>() : forward_smem_bytes<128>());
  return int64_t(smem) <= state_of(ctx, "attention (tensor cores)").max_smem_per_block;
}

int64_t attention_mma_backward_smem_bytes(int64_t D) {
  return int64_t(D == 64 ? backward_smem_bytes<64>() : backward_smem_bytes<128>());
}

int64_t attention_mma_forward_scratch_bytes(int64_t B, int64_t T) {
  return B * ceil_div(T, kTile) * int64_t(sizeof(uint2));
}

bool attention_mma_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                           int n_q_heads, int n_kv_heads, double scale, const MmaTokenSubset& subset) {
  constexpr const char* op = "attention_forward (tensor cores)";
  const Shape s{int(qkv.dim(0)), int(qkv.dim(1)), n_q_heads, n_kv_heads, int(qkv.dim(3))};
  if (!attention_mma_supports(ctx, qkv, n_q_heads, /*backward=*/false)) return false;
  if (out.dtype != DType::bf16 || !aligned16(out.data)) return false;
  // The online softmax keeps its running maxima over raw scores, which needs a positive scale;
  // the CUDA-core kernels take any other.
  if (!(scale > 0)) return false;
  CudaState& state = state_of(ctx, op);
  const int32_t* seg = segment_ids.present() ? segment_ids.ptr<int32_t>() : nullptr;
  uint2* ranges = nullptr;
  if (seg) {
    const int64_t range_bytes = attention_mma_forward_scratch_bytes(s.B, s.T);
    char* scratch = static_cast<char*>(scratch_buffer(state, subset.scratch_offset + range_bytes, op));
    ranges = reinterpret_cast<uint2*>(scratch + subset.scratch_offset);
    tile_segment_ranges(state, ranges, seg, subset.short_token, s.B, s.T);
  }
  if (attention_wgmma_takes(state, s.D)) {
    attention_wgmma_forward(state, out.ptr<bf16>(), lse.ptr<float>(), qkv.ptr<bf16>(), seg, ranges, s, scale);
    attention_set_mma_kernels("wgmma");
  } else {
    if (s.D == 64) launch_forward<64>(state, out, lse, qkv, seg, ranges, s, scale);
    else launch_forward<128>(state, out, lse, qkv, seg, ranges, s, scale);
    attention_set_mma_kernels("mma.sync");
  }
  attention_set_last_path("mma");
  return true;
}

}  // namespace ingot::cuda
