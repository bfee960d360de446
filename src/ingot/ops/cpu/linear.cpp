// Linear layer, Hugging Face weight layout (O,I). All three GEMMs go through matmul() (see
// matmul.h), which is bit-identical for any thread count.
// Invariants: din OVERWRITES; dweight and dbias ACCUMULATE; dbias sums rows in token order with
// threads owning column blocks.
#include <algorithm>

#include "ingot/ops/cpu/cpu_common.h"
#include "ingot/ops/cpu/matmul.h"

namespace ingot::cpu {
namespace {

struct LinearShape {
  int64_t N, I, O;
};

LinearShape linear_shape(const char* op, const Tensor& in, const Tensor& weight) {
  INGOT_CHECK(weight.ndim == 2, op, ": weight must be (O,I), got ", weight.shape_string());
  const int64_t O = weight.dim(0), I = weight.dim(1);
  INGOT_CHECK(in.ndim >= 1 && in.dim(-1) == I, op, ": in ", in.shape_string(),
              " does not end in I = ", I, " of weight ", weight.shape_string());
  return {in.numel() / I, I, O};
}

}  // namespace

// out (N,O) = in (N,I) @ weight (O,I)^T + bias (O) + residual (N,O)
void linear_forward(Context& ctx, Tensor out, Tensor in, Tensor weight, Tensor bias, Tensor residual) {
  constexpr const char* op = "linear_forward";
  detail::dispatch_float(op, in.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "in", in, in.dtype);
    detail::check_tensor(op, "weight", weight, in.dtype);
    detail::check_tensor(op, "out", out, in.dtype);
    const auto [N, I, O] = linear_shape(op, in, weight);
    INGOT_CHECK(out.dim(-1) == O && out.numel() == N * O, op, ": out ", out.shape_string(),
                " is not (", N, ",", O, ")");
    if (residual.present()) {
      detail::check_tensor(op, "residual", residual, in.dtype);
      detail::check_numel(op, "residual", residual, N * O);
      if (residual.data != out.data)
        std::copy(residual.ptr<T>(), residual.ptr<T>() + N * O, out.ptr<T>());
    }
    // B (I,O) = weight^T: row stride 1, column stride I. With a residual, out already holds it.
    matmul<T>(ctx.num_threads, N, O, I, in.ptr<T>(), I, 1, weight.ptr<T>(), 1, I, out.ptr<T>(), O,
              residual.present());
    if (bias.present()) {
      detail::check_tensor(op, "bias", bias, in.dtype);
      detail::check_numel(op, "bias", bias, O);
      const T* b = bias.ptr<T>();
      T* y = out.ptr<T>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t o = 0; o < O; ++o) y[n * O + o] += b[o];
    }
  });
}

// din (N,I) = dout @ weight; dweight (O,I) += (or =) dout^T @ in; dbias (O) += column sums of dout
void linear_backward(Context& ctx, Tensor din, Tensor dweight, Tensor dbias, Tensor dout,
                     Tensor in, Tensor weight, bool accumulate_dweight) {
  constexpr const char* op = "linear_backward";
  detail::dispatch_float(op, in.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "in", in, in.dtype);
    detail::check_tensor(op, "weight", weight, in.dtype);
    detail::check_tensor(op, "dout", dout, in.dtype);
    const auto [N, I, O] = linear_shape(op, in, weight);
    INGOT_CHECK(dout.dim(-1) == O && dout.numel() == N * O, op, ": dout ", dout.shape_string(),
                " is not (", N, ",", O, ")");
    const T* g = dout.ptr<T>();
    if (din.present()) {
      detail::check_tensor(op, "din", din, in.dtype);
      detail::check_numel(op, "din", din, N * I);
      // A = dout (N,O), B = weight (O,I), both row-major.
      matmul<T>(ctx.num_threads, N, I, O, g, O, 1, weight.ptr<T>(), I, 1, din.ptr<T>(), I, false);
    }
    if (dweight.present()) {
      detail::check_tensor(op, "dweight", dweight, in.dtype);
      detail::check_numel(op, "dweight", dweight, O * I);
      // A (O,N) = dout^T: row stride 1, column stride O; B = in (N,I).
      matmul<T>(ctx.num_threads, O, I, N, g, 1, O, in.ptr<T>(), I, 1, dweight.ptr<T>(), I,
                accumulate_dweight);
    }
    if (dbias.present()) {
      detail::check_tensor(op, "dbias", dbias, in.dtype);
      detail::check_numel(op, "dbias", dbias, O);
      T* db = dbias.ptr<T>();
      constexpr int64_t kBlock = 64;
      const int64_t n_blocks = (O + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        const int64_t o0 = blk * kBlock, width = std::min(kBlock, O - o0);
        T acc[kBlock] = {};
        for (int64_t n = 0; n < N; ++n)
          for (int64_t o = 0; o < width; ++o) acc[o] += g[n * O + o0 + o];
        for (int64_t o = 0; o < width; ++o) db[o0 + o] += acc[o];
      }
    }
  });
}

}  // namespace ingot::cpu
