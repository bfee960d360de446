// Shared pieces of the causal GQA attention kernels. Shape, attends() and the delta kernel serve
// both kernel families: the CUDA-core kernels (attention_forward.cu, attention_backward.cu) and the
// tensor-core ones (attention_mma.cuh). The rest describes the CUDA-core kernels, correctness-first
// flash-attention-2 style:
//   - tiles of kBlockQ query rows x kBlockK key rows, staged in shared memory as f32 (rows padded
//     to D+1 floats so that column walks hit distinct banks);
//   - 256 threads as a 16 x 16 grid: thread (ty, tx) owns tile rows ty*4 + a (a < 4) and tile
//     columns tx + 16*b (b < 4) of every score tile, and output columns d = tx + 16*j;
//   - the S x S score matrix never exists beyond one tile; the forward saves lse; the backward
//     recomputes P from lse.
// The faster paths (cuDNN's fused attention, the mma.sync kernels of attention_mma.cuh) keep the
// masking and the lse/delta contracts; the tensor-core kernels stage bf16 tiles instead.
#pragma once
#include "ingot/ops/cuda/attention_cudnn.h"
#include "ingot/ops/cuda/common.cuh"

namespace ingot::cuda::attention {

constexpr int kBlockQ = 64;
constexpr int kBlockK = 64;
constexpr int kThreads = 256;
constexpr int kMaxHeadDim = int(kMaxAttentionHeadDim);
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared memory of the CUDA-core forward (floats): Q (BQ, D+1) | K (BK, D+1) | V (BK, D+1) |
// S (BQ, BK+1) | m, l, alpha (BQ each) | seg_q (BQ), seg_k (BK) as int.
inline size_t forward_smem_bytes(int D) {
  return sizeof(float) * (size_t(kBlockQ + 2 * kBlockK) * (D + 1) + size_t(kBlockQ) * (kBlockK + 1) +
                          3 * kBlockQ) +
         sizeof(int) * (kBlockQ + kBlockK);
}

// Of the CUDA-core backward (floats): K, V, Q, dO (rows, D+1) | P, dS (BQ, BK+1) | lse, delta (BQ) |
// seg_q, seg_k (ints). The dq kernel uses the same layout (P unused).
inline size_t backward_smem_bytes(int D) {
  return sizeof(float) * (size_t(2 * kBlockK + 2 * kBlockQ) * (D + 1) +
                          2 * size_t(kBlockQ) * (kBlockK + 1) + 2 * kBlockQ) +
         sizeof(int) * (kBlockQ + kBlockK);
}

// The CUDA-core kernels take every shape but stage f32 tiles: at D = 128 the backward wants 166400
// bytes a block, above what sm_86/sm_89 GPUs give (101376). Launched anyway, the kernel failed in
// cudaFuncSetAttribute with "invalid argument", in step 1 after every arena was allocated.
inline void check_kernels_fit(int D, size_t smem, int max_smem_per_block, const char* op) {
  INGOT_CHECK(int64_t(smem) <= max_smem_per_block, op, ": Ingot's CUDA-core attention kernels need ", smem,
              " bytes of shared memory a block at head_dim ", D, ", and this GPU gives ", max_smem_per_block,
              " (they run for the fp32 recipe, under INGOT_ATTENTION=kernels, and where neither cuDNN nor the "
              "tensor-core kernels take the call; train on a GPU with more shared memory a block, such as an A100 "
              "or H100, or on the CPU)");
}

struct Shape {
  int B, T, Hq, Hkv, D;
  __host__ __device__ int Htot() const { return Hq + 2 * Hkv; }
};

// Loads rows [row0, row0 + rows) of one head of qkv-like (B,T,H,D) storage (head `head`, row
// stride `H*D`) into dst (rows, D+1) f32; rows past T are zero-filled.
template <typename T>
__device__ __forceinline__ void load_tile(float* dst, const T* base, int64_t row_stride, int row0,
                                          int rows, int T_len, int D) {
  const int DP = D + 1;
  if (D % 8 == 0) {
    const int chunks = D / 8;
    for (int e = threadIdx.x; e < rows * chunks; e += blockDim.x) {
      const int r = e / chunks, c = (e % chunks) * 8;
      float f[8];
      if (row0 + r < T_len) {
        load8(base + int64_t(row0 + r) * row_stride + c, f);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = 0.f;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) dst[r * DP + c + k] = f[k];
    }
  } else {
    for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
      const int r = e / D, c = e % D;
      dst[r * DP + c] = row0 + r < T_len ? to_f32(base[int64_t(row0 + r) * row_stride + c]) : 0.f;
    }
  }
}

// Token i attends to token j iff both exist, j <= i and (without segments, or) same segment.
__device__ __forceinline__ bool attends(int i, int j, int T_len, int seg_i, int seg_j) {
  return i < T_len && j < T_len && j <= i && seg_i == seg_j;
}

// The backward prologue of both kernel families (the CUDA-core ones and attention_mma.cuh's):
// delta[b,h,t] = sum_d dout[b,t,h,d] * out[b,t,h,d], one warp per (b, t, h).
template <typename T>
__global__ void attention_delta_kernel(float* delta, const T* dout, const T* out, Shape s) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = int64_t(s.B) * s.T * s.Hq;
  for (int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; row < rows;
       row += int64_t(gridDim.x) * blockDim.x / 32) {
    float acc = 0.f;
    for (int d = lane; d < s.D; d += 32) acc += to_f32(dout[row * s.D + d]) * to_f32(out[row * s.D + d]);
    acc = warp_sum(acc);
    if (lane == 0) {
      const int h = int(row % s.Hq);
      const int64_t bt = row / s.Hq;
      const int t = int(bt % s.T);
      const int64_t b = bt / s.T;
      delta[(b * s.Hq + h) * s.T + t] = acc;
    }
  }
}

// Calls f(std::integral_constant<int, DMAX>) with the smallest supported DMAX >= D.
template <typename F>
void dispatch_head_dim(int D, const char* op, F&& f) {
  if (D <= 32) f(std::integral_constant<int, 32>{});
  else if (D <= 64) f(std::integral_constant<int, 64>{});
  else if (D <= kMaxHeadDim) f(std::integral_constant<int, kMaxHeadDim>{});
  else fail(op, ": head dim ", D, " exceeds ", kMaxHeadDim, " (the CUDA-core attention kernels)");
}

}  // namespace ingot::cuda::attention
