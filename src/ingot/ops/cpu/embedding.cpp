// Token embedding lookup and its scatter-add backward.
// Invariants: ids are validated before any parallel region; the backward splits the hidden
// dimension C across threads and adds tokens in index order, so dtable is bit-identical for any
// thread count and repeated ids accumulate deterministically.
#include <algorithm>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {

// out (N,C) = table (V,C) [ids (N)]
void embedding_forward(Context& ctx, Tensor out, Tensor ids, Tensor table) {
  constexpr const char* op = "embedding_forward";
  detail::dispatch_float(op, table.dtype, [&](auto tag) {
    using T = decltype(tag);
    INGOT_CHECK(table.ndim == 2, op, ": table must be (V,C), got ", table.shape_string());
    const int64_t V = table.dim(0), C = table.dim(1), N = ids.numel();
    detail::check_tensor(op, "table", table, table.dtype);
    detail::check_tensor(op, "out", out, table.dtype);
    detail::check_tensor(op, "ids", ids, DType::i32);
    detail::check_numel(op, "out", out, N * C);
    const int32_t* id = ids.ptr<int32_t>();
    detail::check_ids(op, "ids", id, N, V, false);
    const T* w = table.ptr<T>();
    T* o = out.ptr<T>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t n = 0; n < N; ++n) std::copy_n(w + id[n] * C, C, o + n * C);
  });
}

// dtable (V,C) += scatter of dout (N,C) by ids (N); tokens of padding_id (-1: none) add nothing.
void embedding_backward(Context& ctx, Tensor dtable, Tensor dout, Tensor ids, int64_t padding_id) {
  constexpr const char* op = "embedding_backward";
  detail::dispatch_float(op, dtable.dtype, [&](auto tag) {
    using T = decltype(tag);
    INGOT_CHECK(dtable.ndim == 2, op, ": dtable must be (V,C), got ", dtable.shape_string());
    const int64_t V = dtable.dim(0), C = dtable.dim(1), N = ids.numel();
    detail::check_tensor(op, "dtable", dtable, dtable.dtype);
    detail::check_tensor(op, "dout", dout, dtable.dtype);
    detail::check_tensor(op, "ids", ids, DType::i32);
    detail::check_numel(op, "dout", dout, N * C);
    const int32_t* id = ids.ptr<int32_t>();
    detail::check_ids(op, "ids", id, N, V, false);
    const T* g = dout.ptr<T>();
    T* d = dtable.ptr<T>();
    // Column blocks of 16: each thread owns whole columns, so no two threads touch one element.
    constexpr int64_t kBlock = 16;
    const int64_t n_blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t blk = 0; blk < n_blocks; ++blk) {
      const int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
      for (int64_t n = 0; n < N; ++n) {
        if (id[n] == padding_id) continue;
        T* row = d + id[n] * C;
        const T* src = g + n * C;
        for (int64_t c = c0; c < c1; ++c) row[c] += src[c];
      }
    }
  });
}

}  // namespace ingot::cpu
