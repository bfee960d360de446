// Token embedding. out (N,C) = table (V,C)[ids (N)]; dtable (V,C) += scatter of dout (N,C).
// Invariants:
//   - The backward is deterministic: ids are stably radix-sorted with their token indices (cub),
//     and the sorted positions are cut into chunks of kRowsPerChunk. Each chunk sums each run of
//     equal ids it holds in token order in f32; a run inside one chunk is added into dtable by that
//     chunk, and a run that spans chunks leaves one partial sum per chunk, which a second kernel
//     adds up in chunk order. No float atomics, and no block sums more than a chunk's rows: a very
//     frequent id (padding, in padded rows most of the batch) used to serialise on one block.
//   - An id outside [0, V) yields a NaN row in the forward (visible in the loss) and is skipped in
//     the backward: a device kernel cannot throw. So is padding_id, whose tokens add nothing.
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

constexpr int64_t kRowsPerChunk = 64;

// Adds the dout rows rows[0, count) (token indices, in token order) into acc, for the VEC columns
// from c.
template <int VEC, typename TG>
__device__ void sum_rows(float (&acc)[VEC], const TG* dout, const int32_t* rows, int64_t count, int64_t C,
                         int64_t c) {
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
#pragma unroll 4
  for (int64_t j = 0; j < count; ++j) {
    float g[VEC];
    load_vec<VEC>(dout + int64_t(rows[j]) * C + c, g);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] += g[k];
  }
}

template <int VEC, typename TD>
__device__ void add_into(TD* row, const float (&acc)[VEC]) {
  float d[VEC];
  load_vec<VEC>(row, d);
#pragma unroll
  for (int k = 0; k < VEC; ++k) d[k] += acc[k];
  store_vec<VEC>(row, d);
}

// grid (chunks): chunk b holds sorted positions [b K, b K + K). Each run of equal ids in it is
// summed; a run wholly inside the chunk goes into dtable, a piece of a longer run into
// partials (chunks, 2, C): slot 0 for the piece that continues a run from the chunk before,
// slot 1 for the piece that starts a run going on into the next chunk. The chunk's ids and token
// indices are staged in shared memory first: with ids spread over the vocabulary every run is one
// row, and the block walks 64 of them one after another.
template <int VEC, typename TD, typename TG>
__global__ void embedding_backward_chunks_kernel(TD* dtable, float* partials, const TG* dout,
                                                 const int32_t* sorted_ids, const int32_t* sorted_index,
                                                 int64_t N, int64_t C, int64_t V, int64_t padding_id) {
  __shared__ int32_t ids[kRowsPerChunk], rows[kRowsPerChunk];
  const int64_t begin = blockIdx.x * kRowsPerChunk, n = min(N - begin, kRowsPerChunk);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    ids[j] = sorted_ids[begin + j];
    rows[j] = sorted_index[begin + j];
  }
  __syncthreads();
  const bool first_continues = begin > 0 && sorted_ids[begin - 1] == ids[0];
  const bool last_continues = begin + n < N && sorted_ids[begin + n] == ids[n - 1];
  for (int64_t s = 0; s < n;) {
    const int32_t id = ids[s];
    int64_t e = s + 1;
    while (e < n && ids[e] == id) ++e;
    const bool from_before = s == 0 && first_continues, into_next = e == n && last_continues;
    if (id >= 0 && id < V && id != padding_id) {
      for (int64_t c = int64_t(threadIdx.x) * VEC; c < C; c += int64_t(blockDim.x) * VEC) {
        float acc[VEC];
        sum_rows<VEC>(acc, dout, rows + s, e - s, C, c);
        if (from_before || into_next)
          store_vec<VEC>(partials + (int64_t(blockIdx.x) * 2 + (from_before ? 0 : 1)) * C + c, acc);
        else
          add_into<VEC>(dtable + int64_t(id) * C + c, acc);
      }
    }
    s = e;
  }
}

// grid (chunks): chunk b owns the run that starts in it and goes on into the next chunk, if any,
// and adds that run's partial sums into dtable in chunk order.
template <int VEC, typename TD>
__global__ void embedding_backward_runs_kernel(TD* dtable, const float* partials, const int32_t* sorted_ids,
                                               int64_t N, int64_t C, int64_t V, int64_t padding_id) {
  const int64_t begin = blockIdx.x * kRowsPerChunk, end = min(N, begin + kRowsPerChunk);
  const int32_t id = sorted_ids[end - 1];
  const bool into_next = end < N && sorted_ids[end] == id;
  const bool started_before = sorted_ids[begin] == id && begin > 0 && sorted_ids[begin - 1] == id;
  if (!into_next || started_before || id < 0 || id >= V || id == padding_id) return;
  for (int64_t c = int64_t(threadIdx.x) * VEC; c < C; c += int64_t(blockDim.x) * VEC) {
    float acc[VEC], piece[VEC];
    load_vec<VEC>(partials + (int64_t(blockIdx.x) * 2 + 1) * C + c, acc);
    for (int64_t chunk = blockIdx.x + 1;; ++chunk) {  // each later chunk's slot 0, while the run goes on
      load_vec<VEC>(partials + (chunk * 2) * C + c, piece);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += piece[k];
      const int64_t chunk_end = min(N, (chunk + 1) * kRowsPerChunk);
      if (!(sorted_ids[chunk_end - 1] == id && chunk_end < N && sorted_ids[chunk_end] == id)) break;
    }
    add_into<VEC>(dtable + int64_t(id) * C + c, acc);
  }
}

// Calls f(std::integral_constant<int, 8>) when rows are 16-byte vectors, else with 1 element.
template <typename F>
void with_vector_width(bool vec, F&& f) {
  if (vec) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 1>{});
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
      with_vector_width(vec, [&](auto width) {
        constexpr int VEC = decltype(width)::value;
        embedding_forward_kernel<VEC, TO, TT><<<grid_for(N * C / VEC, threads, state), threads, 0, state.stream>>>(
            out.ptr<TO>(), ids.ptr<int32_t>(), table.ptr<TT>(), N, C, V);
      });
      INGOT_LAUNCH_CHECK("embedding_forward_kernel");
    });
  });
}

namespace {
// The scratch before cub's storage: sorted ids, token indices in and sorted (N each) | partials
// (chunks, 2, C) f32; each part 256-byte aligned.
int64_t embedding_scratch_before_sort(int64_t N, int64_t C) {
  const int64_t slot = ceil_div(N * 4, 256) * 256;
  return 3 * slot + ceil_div(ceil_div(N, kRowsPerChunk) * 2 * C * 4, 256) * 256;
}
}  // namespace

int64_t embedding_backward_scratch_bytes(int64_t N, int64_t C) {
  // cub's radix sort of N (key, value) pairs of 4 bytes keeps a second copy of each (8 N bytes),
  // histograms, and look-back state that grows with N (0.116 N bytes measured with CUB 3.0 on an
  // H200, by a review): 8 N + N / 4 + 1 MiB bounds it.
  return embedding_scratch_before_sort(N, C) + 8 * N + N / 4 + (int64_t(1) << 20);
}

void embedding_backward(Context& ctx, Tensor dtable, Tensor dout, Tensor ids, int64_t padding_id) {
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

  // Scratch layout: sorted ids (N) | index in (N) | sorted index (N) | partials (chunks, 2, C) f32 |
  // cub temp storage.
  size_t temp_bytes = 0;
  INGOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr),
                                                   static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), int(N), 0, 32,
                                                   state.stream));
  const int64_t chunks = ceil_div(N, kRowsPerChunk), slot = ceil_div(N * 4, 256) * 256;
  const int64_t before_sort = embedding_scratch_before_sort(N, C);
  char* scratch = static_cast<char*>(scratch_buffer(state, before_sort + int64_t(temp_bytes), op));
  int32_t* sorted_ids = reinterpret_cast<int32_t*>(scratch);
  int32_t* index = reinterpret_cast<int32_t*>(scratch + slot);
  int32_t* sorted_index = reinterpret_cast<int32_t*>(scratch + 2 * slot);
  float* partials = reinterpret_cast<float*>(scratch + 3 * slot);
  void* temp = scratch + before_sort;
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
      with_vector_width(vec, [&](auto width) {
        constexpr int VEC = decltype(width)::value;
        embedding_backward_chunks_kernel<VEC, TD, TG><<<unsigned(chunks), threads, 0, state.stream>>>(
            dtable.ptr<TD>(), partials, dout.ptr<TG>(), sorted_ids, sorted_index, N, C, V, padding_id);
        INGOT_LAUNCH_CHECK("embedding_backward_chunks_kernel");
        embedding_backward_runs_kernel<VEC, TD><<<unsigned(chunks), threads, 0, state.stream>>>(
            dtable.ptr<TD>(), partials, sorted_ids, N, C, V, padding_id);
        INGOT_LAUNCH_CHECK("embedding_backward_runs_kernel");
      });
    });
  });
}

}  // namespace ingot::cuda
