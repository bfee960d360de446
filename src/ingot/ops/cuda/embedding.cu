// Token embedding. out (N,C) = table (V,C)[ids (N)]; dtable (V,C) += scatter of dout (N,C).
// Invariants:
//   - The backward is deterministic: ids are stably radix-sorted with their token indices (cub),
//     then one block per run of equal ids sums its dout rows in token order in f32 and adds the
//     sum into dtable once. No float atomics. A token that repeats k times costs one block k row
//     reads (a very frequent id serialises on one SM; acceptable at LLM batch sizes).
//   - An id outside [0, V) yields a NaN row in the forward (visible in the loss) and is skipped in
//     the backward: a device kernel cannot throw.
#include <cub/device/device_radix_sort.cuh>

#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/cuda_ops.h"

namespace ingot::cuda {

namespace {

// One thread per VEC-element chunk of an output row.
template <int VEC, typename TO, typename TT>
__global__ void embedding_forward_kernel(TO* out, const int32_t* ids, const TT* table, int64_t N,
                                         int64_t C, int64_t V) {
  const int64_t chunks_per_row = C / VEC;
  const int64_t total = N * chunks_per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / chunks_per_row, c = (i % chunks_per_row) * VEC;
    const int32_t id = ids[n];
    float f[VEC];
    if (id >= 0 && id < V) {
      load_vec<VEC>(table + id * C + c, f);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) f[k] = __int_as_float(0x7fc00000);
    }
    store_vec<VEC>(out + n * C + c, f);
  }
}

__global__ void embedding_iota_kernel(int32_t* index, int64_t N) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N;
       i += int64_t(gridDim.x) * blockDim.x)
    index[i] = static_cast<int32_t>(i);
}

// grid (N): block b works only if sorted position b starts a run of equal ids. Threads stride
// over the row's VEC-chunks; each sums the run's rows in sorted (= token) order.
template <int VEC, typename TD, typename TG>
__global__ void embedding_backward_kernel(TD* dtable, const TG* dout, const int32_t* sorted_ids,
                                          const int32_t* sorted_index, int64_t N, int64_t C,
                                          int64_t V) {
  const int64_t start = blockIdx.x;
  const int32_t id = sorted_ids[start];
  if (start > 0 && sorted_ids[start - 1] == id) return;
  if (id < 0 || id >= V) return;
  int64_t end = start + 1;
  while (end < N && sorted_ids[end] == id) ++end;
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < C; c += int64_t(blockDim.x) * VEC) {
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    for (int64_t j = start; j < end; ++j) {
      float g[VEC];
      load_vec<VEC>(dout + int64_t(sorted_index[j]) * C + c, g);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += g[k];
    }
    float d[VEC];
    load_vec<VEC>(dtable + int64_t(id) * C + c, d);
#pragma unroll
    for (int k = 0; k < VEC; ++k) d[k] += acc[k];
    store_vec<VEC>(dtable + int64_t(id) * C + c, d);
  }
}

}  // namespace

void embedding_forward(Context& ctx, Tensor out, Tensor ids, Tensor table) {
  constexpr const char* op = "embedding_forward";
  CudaState& state = state_of(ctx, op);
  check_tensor(out, op, "out");
  check_tensor(ids, op, "ids");
  check_tensor(table, op, "table");
  check_dtype(ids, DType::i32, op, "ids");
  INGOT_CHECK(table.ndim == 2, op, ": table must be (V,C), got ", table.shape_string());
  const int64_t V = table.dim(0), C = table.dim(1), N = ids.numel();
  check_numel(out, N * C, op, "out");
  if (N == 0) return;
  const bool vec = C % 8 == 0 && aligned16(out.data) && aligned16(table.data);
  dispatch_float(out.dtype, op, [&](auto out_tag) {
    using TO = decltype(out_tag);
    dispatch_float(table.dtype, op, [&](auto table_tag) {
      using TT = decltype(table_tag);
      constexpr int threads = 256;
      if (vec) {
        embedding_forward_kernel<8, TO, TT><<<grid_for(N * C / 8, threads, state), threads, 0, state.stream>>>(
            out.ptr<TO>(), ids.ptr<int32_t>(), table.ptr<TT>(), N, C, V);
      } else {
        embedding_forward_kernel<1, TO, TT><<<grid_for(N * C, threads, state), threads, 0, state.stream>>>(
            out.ptr<TO>(), ids.ptr<int32_t>(), table.ptr<TT>(), N, C, V);
      }
      INGOT_LAUNCH_CHECK("embedding_forward_kernel");
    });
  });
}

void embedding_backward(Context& ctx, Tensor dtable, Tensor dout, Tensor ids) {
  constexpr const char* op = "embedding_backward";
  CudaState& state = state_of(ctx, op);
  check_tensor(dtable, op, "dtable");
  check_tensor(dout, op, "dout");
  check_tensor(ids, op, "ids");
  check_dtype(ids, DType::i32, op, "ids");
  INGOT_CHECK(dtable.ndim == 2, op, ": dtable must be (V,C), got ", dtable.shape_string());
  const int64_t V = dtable.dim(0), C = dtable.dim(1), N = ids.numel();
  check_numel(dout, N * C, op, "dout");
  if (N == 0) return;
  INGOT_CHECK(N < (int64_t(1) << 31), op, ": ", N, " tokens exceed the i32 index range");

  // Scratch layout: sorted ids (N) | index in (N) | sorted index (N) | cub temp storage.
  size_t temp_bytes = 0;
  INGOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr),
                                                   static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), int(N), 0, 32,
                                                   state.stream));
  const int64_t slot = ceil_div(N * 4, 256) * 256;
  char* scratch = static_cast<char*>(scratch_buffer(state, 3 * slot + int64_t(temp_bytes), op));
  int32_t* sorted_ids = reinterpret_cast<int32_t*>(scratch);
  int32_t* index = reinterpret_cast<int32_t*>(scratch + slot);
  int32_t* sorted_index = reinterpret_cast<int32_t*>(scratch + 2 * slot);
  void* temp = scratch + 3 * slot;

  embedding_iota_kernel<<<grid_for(N, 256, state), 256, 0, state.stream>>>(index, N);
  INGOT_LAUNCH_CHECK("embedding_iota_kernel");
  // LSD radix sort is stable: equal ids keep token order, which makes the sum order fixed.
  INGOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids.ptr<const int32_t>(), sorted_ids,
                                                   static_cast<const int32_t*>(index), sorted_index,
                                                   int(N), 0, 32, state.stream));

  const bool vec = C % 8 == 0 && aligned16(dtable.data) && aligned16(dout.data);
  dispatch_float(dtable.dtype, op, [&](auto d_tag) {
    using TD = decltype(d_tag);
    dispatch_float(dout.dtype, op, [&](auto g_tag) {
      using TG = decltype(g_tag);
      constexpr int threads = 256;
      if (vec) {
        embedding_backward_kernel<8, TD, TG><<<unsigned(N), threads, 0, state.stream>>>(
            dtable.ptr<TD>(), dout.ptr<TG>(), sorted_ids, sorted_index, N, C, V);
      } else {
        embedding_backward_kernel<1, TD, TG><<<unsigned(N), threads, 0, state.stream>>>(
            dtable.ptr<TD>(), dout.ptr<TG>(), sorted_ids, sorted_index, N, C, V);
      }
      INGOT_LAUNCH_CHECK("embedding_backward_kernel");
    });
  });
}

}  // namespace ingot::cuda
