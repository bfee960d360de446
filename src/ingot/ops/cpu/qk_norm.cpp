// Qwen3-style per-head RMSNorm of q and k inside packed qkv (N,Htot,D), Htot = Hq + 2*Hkv.
// Invariants: heads [0,Hq) use q_weight, [Hq,Hq+Hkv) use k_weight, v heads pass through
// unchanged (forward) / with their gradient unchanged (backward). rstd (N, Hq+Hkv) in the input
// dtype. din OVERWRITES; dq_weight/dk_weight accumulate, each element summed over (token, head)
// in order by one thread (threads own blocks of D), so results do not depend on thread count.
#include <algorithm>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {
namespace {

struct QkShape {
  int64_t N, Htot, D, Hq, Hkv;
};

QkShape qk_shape(const char* op, const Tensor& in, const Tensor& q_weight, const Tensor& k_weight,
                 int n_q_heads, int n_kv_heads) {
  INGOT_CHECK(in.ndim >= 3, op, ": in must be (N,Htot,D), got ", in.shape_string());
  QkShape s{0, in.dim(-2), in.dim(-1), n_q_heads, n_kv_heads};
  INGOT_CHECK(s.Hq > 0 && s.Hkv > 0 && s.Htot == s.Hq + 2 * s.Hkv, op, ": in ",
              in.shape_string(), " has ", s.Htot, " heads, expected Hq + 2*Hkv = ",
              s.Hq + 2 * s.Hkv);
  s.N = in.numel() / (s.Htot * s.D);
  detail::check_numel(op, "q_weight", q_weight, s.D);
  detail::check_numel(op, "k_weight", k_weight, s.D);
  return s;
}

}  // namespace

// out (N,Htot,D); rstd (N,Hq+Hkv)
void qk_norm_forward(Context& ctx, Tensor out, Tensor rstd, Tensor in, Tensor q_weight,
                     Tensor k_weight, int n_q_heads, int n_kv_heads, double eps) {
  constexpr const char* op = "qk_norm_forward";
  detail::dispatch_float(op, in.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "in", in, in.dtype);
    detail::check_tensor(op, "out", out, in.dtype);
    detail::check_tensor(op, "q_weight", q_weight, in.dtype);
    detail::check_tensor(op, "k_weight", k_weight, in.dtype);
    detail::check_tensor(op, "rstd", rstd, ops::compute_dtype(in.dtype));
    const QkShape s = qk_shape(op, in, q_weight, k_weight, n_q_heads, n_kv_heads);
    const int64_t Hn = s.Hq + s.Hkv;  // normed heads per token
    detail::check_numel(op, "out", out, in.numel());
    detail::check_numel(op, "rstd", rstd, s.N * Hn);
    const T* x = in.ptr<T>();
    const T* wq = q_weight.ptr<T>();
    const T* wk = k_weight.ptr<T>();
    T* y = out.ptr<T>();
    T* r = rstd.ptr<T>();
    const T e = static_cast<T>(eps);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t n = 0; n < s.N; ++n) {
      for (int64_t h = 0; h < s.Htot; ++h) {
        const int64_t off = (n * s.Htot + h) * s.D;
        if (h < Hn)
          r[n * Hn + h] = detail::rmsnorm_row_forward(y + off, x + off, h < s.Hq ? wq : wk, s.D, e);
        else
          std::copy_n(x + off, s.D, y + off);
      }
    }
  });
}

// din (N,Htot,D) overwrite; dq_weight, dk_weight (D) accumulate.
void qk_norm_backward(Context& ctx, Tensor din, Tensor dq_weight, Tensor dk_weight, Tensor dout,
                      Tensor in, Tensor q_weight, Tensor k_weight, Tensor rstd, int n_q_heads,
                      int n_kv_heads) {
  constexpr const char* op = "qk_norm_backward";
  detail::dispatch_float(op, in.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "in", in, in.dtype);
    detail::check_tensor(op, "dout", dout, in.dtype);
    detail::check_tensor(op, "q_weight", q_weight, in.dtype);
    detail::check_tensor(op, "k_weight", k_weight, in.dtype);
    detail::check_tensor(op, "rstd", rstd, ops::compute_dtype(in.dtype));
    const QkShape s = qk_shape(op, in, q_weight, k_weight, n_q_heads, n_kv_heads);
    const int64_t Hn = s.Hq + s.Hkv, D = s.D;
    detail::check_numel(op, "dout", dout, in.numel());
    detail::check_numel(op, "rstd", rstd, s.N * Hn);
    const T* x = in.ptr<T>();
    const T* g = dout.ptr<T>();
    const T* r = rstd.ptr<T>();
    if (din.present()) {
      detail::check_tensor(op, "din", din, in.dtype);
      detail::check_numel(op, "din", din, in.numel());
      const T* wq = q_weight.ptr<T>();
      const T* wk = k_weight.ptr<T>();
      T* dx = din.ptr<T>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
      for (int64_t n = 0; n < s.N; ++n) {
        for (int64_t h = 0; h < s.Htot; ++h) {
          const int64_t off = (n * s.Htot + h) * D;
          if (h < Hn)
            detail::rmsnorm_row_backward(dx + off, g + off, x + off, h < s.Hq ? wq : wk,
                                         r[n * Hn + h], D, false);
          else
            std::copy_n(g + off, D, dx + off);
        }
      }
    }
    // dweight_d += sum over tokens n, heads h in [h0,h1) of dout * in * rstd, in (n, h) order.
    auto weight_grad = [&](Tensor dweight, const char* name, int64_t h0, int64_t h1) {
      if (!dweight.present()) return;
      detail::check_tensor(op, name, dweight, in.dtype);
      detail::check_numel(op, name, dweight, D);
      T* dw = dweight.ptr<T>();
      constexpr int64_t kBlock = 16;
      const int64_t n_blocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        const int64_t d0 = blk * kBlock, width = std::min(kBlock, D - d0);
        T acc[kBlock] = {};
        for (int64_t n = 0; n < s.N; ++n)
          for (int64_t h = h0; h < h1; ++h) {
            const int64_t off = (n * s.Htot + h) * D + d0;
            const T rs = r[n * Hn + h];
            for (int64_t d = 0; d < width; ++d) acc[d] += g[off + d] * (x[off + d] * rs);
          }
        for (int64_t d = 0; d < width; ++d) dw[d0 + d] += acc[d];
      }
    };
    weight_grad(dq_weight, "dq_weight", 0, s.Hq);
    weight_grad(dk_weight, "dk_weight", s.Hq, Hn);
  });
}

}  // namespace ingot::cpu
