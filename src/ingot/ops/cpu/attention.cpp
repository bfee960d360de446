// Causal grouped-query attention over packed qkv (B,T,Htot,D), Htot = Hq + 2*Hkv.
// Invariants:
//   - Query head h reads kv head h / (Hq/Hkv); token i sees j iff j <= i and (when segment_ids
//     is present) segment_ids[b,i] == segment_ids[b,j]. Every token sees itself, so each row has
//     at least one key and lse is finite.
//   - The forward materialises one row of scores (T) per (b, h, i) task; rows are independent.
//   - The backward recomputes probabilities from lse. dk/dv of a kv head collect contributions
//     from all its query heads and all queries, so one thread owns each (b, kv head) and adds
//     them in (h, i, j) order: dqkv is bit-identical for any thread count. dqkv OVERWRITES.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {
namespace {

struct AttentionShape {
  int64_t B, T, Htot, D, Hq, Hkv;
};

AttentionShape attention_shape(const char* op, const Tensor& qkv, const Tensor& segment_ids,
                               int n_q_heads, int n_kv_heads) {
  INGOT_CHECK(qkv.ndim == 4, op, ": qkv must be (B,T,Htot,D), got ", qkv.shape_string());
  AttentionShape s{qkv.dim(0), qkv.dim(1), qkv.dim(2), qkv.dim(3), n_q_heads, n_kv_heads};
  INGOT_CHECK(s.Hq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0, op, ": Hq = ", s.Hq,
              " must be a positive multiple of Hkv = ", s.Hkv);
  INGOT_CHECK(s.Htot == s.Hq + 2 * s.Hkv, op, ": qkv ", qkv.shape_string(), " has ", s.Htot,
              " heads, expected Hq + 2*Hkv = ", s.Hq + 2 * s.Hkv);
  if (segment_ids.present()) {
    detail::check_tensor(op, "segment_ids", segment_ids, DType::i32);
    detail::check_numel(op, "segment_ids", segment_ids, s.B * s.T);
  }
  return s;
}

}  // namespace

// out (B,T,Hq,D); lse (B,Hq,T)
void attention_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                       int n_q_heads, int n_kv_heads, double scale) {
  constexpr const char* op = "attention_forward";
  detail::dispatch_float(op, qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "qkv", qkv, qkv.dtype);
    detail::check_tensor(op, "out", out, qkv.dtype);
    detail::check_tensor(op, "lse", lse, ops::compute_dtype(qkv.dtype));
    const auto [B, Tn, Htot, D, Hq, Hkv] = attention_shape(op, qkv, segment_ids, n_q_heads, n_kv_heads);
    detail::check_numel(op, "out", out, B * Tn * Hq * D);
    detail::check_numel(op, "lse", lse, B * Hq * Tn);
    const int64_t group = Hq / Hkv;
    const T* x = qkv.ptr<T>();
    const int32_t* seg = segment_ids.present() ? segment_ids.ptr<int32_t>() : nullptr;
    T* y = out.ptr<T>();
    T* l = lse.ptr<T>();
    const T sc = static_cast<T>(scale);
    const int64_t n_rows = B * Hq * Tn;
#pragma omp parallel num_threads(ctx.num_threads)
    {
      std::vector<T> scores(static_cast<size_t>(Tn));
#pragma omp for schedule(static)
      for (int64_t row = 0; row < n_rows; ++row) {
        const int64_t i = row % Tn, h = (row / Tn) % Hq, b = row / (Tn * Hq);
        const int64_t g = h / group;
        const T* q = x + ((b * Tn + i) * Htot + h) * D;
        T max = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          if (seg && seg[b * Tn + j] != seg[b * Tn + i]) continue;
          const T* k = x + ((b * Tn + j) * Htot + Hq + g) * D;
          scores[j] = sc * detail::dot(q, k, D);
          max = std::max(max, scores[j]);
        }
        T* o = y + ((b * Tn + i) * Hq + h) * D;
        std::fill_n(o, D, T(0));
        T sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (seg && seg[b * Tn + j] != seg[b * Tn + i]) continue;
          const T p = std::exp(scores[j] - max);
          sum += p;
          const T* v = x + ((b * Tn + j) * Htot + Hq + Hkv + g) * D;
          for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
        }
        const T inv_sum = T(1) / sum;
        for (int64_t d = 0; d < D; ++d) o[d] *= inv_sum;
        l[(b * Hq + h) * Tn + i] = max + std::log(sum);
      }
    }
  });
}

// dqkv (B,T,Htot,D) overwrite.
void attention_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                        Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                        double scale) {
  constexpr const char* op = "attention_backward";
  detail::dispatch_float(op, qkv.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "qkv", qkv, qkv.dtype);
    detail::check_tensor(op, "dqkv", dqkv, qkv.dtype);
    detail::check_tensor(op, "out", out, qkv.dtype);
    detail::check_tensor(op, "dout", dout, qkv.dtype);
    detail::check_tensor(op, "lse", lse, ops::compute_dtype(qkv.dtype));
    const auto [B, Tn, Htot, D, Hq, Hkv] = attention_shape(op, qkv, segment_ids, n_q_heads, n_kv_heads);
    detail::check_numel(op, "dqkv", dqkv, qkv.numel());
    detail::check_numel(op, "out", out, B * Tn * Hq * D);
    detail::check_numel(op, "dout", dout, B * Tn * Hq * D);
    detail::check_numel(op, "lse", lse, B * Hq * Tn);
    const int64_t group = Hq / Hkv;
    const T* x = qkv.ptr<T>();
    const T* y = out.ptr<T>();
    const T* dy = dout.ptr<T>();
    const T* l = lse.ptr<T>();
    const int32_t* seg = segment_ids.present() ? segment_ids.ptr<int32_t>() : nullptr;
    T* dx = dqkv.ptr<T>();
    const T sc = static_cast<T>(scale);
    const int64_t n_tasks = B * Hkv;
#pragma omp parallel num_threads(ctx.num_threads)
    {
      std::vector<T> dq(static_cast<size_t>(D));
#pragma omp for schedule(static)
      for (int64_t task = 0; task < n_tasks; ++task) {
        const int64_t b = task / Hkv, g = task % Hkv;
        auto k_off = [&](int64_t j) { return ((b * Tn + j) * Htot + Hq + g) * D; };
        auto v_off = [&](int64_t j) { return ((b * Tn + j) * Htot + Hq + Hkv + g) * D; };
        for (int64_t j = 0; j < Tn; ++j) {
          std::fill_n(dx + k_off(j), D, T(0));
          std::fill_n(dx + v_off(j), D, T(0));
        }
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          for (int64_t i = 0; i < Tn; ++i) {
            const int64_t q_off = ((b * Tn + i) * Htot + h) * D;
            const int64_t o_off = ((b * Tn + i) * Hq + h) * D;
            const T* q = x + q_off;
            const T* dyi = dy + o_off;
            const T lse_i = l[(b * Hq + h) * Tn + i];
            // delta = sum_j p_j dp_j = dout_i . out_i
            const T delta = detail::dot(dyi, y + o_off, D);
            std::fill(dq.begin(), dq.end(), T(0));
            for (int64_t j = 0; j <= i; ++j) {
              if (seg && seg[b * Tn + j] != seg[b * Tn + i]) continue;
              const T* k = x + k_off(j);
              const T* v = x + v_off(j);
              const T p = std::exp(sc * detail::dot(q, k, D) - lse_i);
              const T ds = p * (detail::dot(dyi, v, D) - delta);
              const T ds_scaled = sc * ds;
              T* dk = dx + k_off(j);
              T* dv = dx + v_off(j);
              for (int64_t d = 0; d < D; ++d) {
                dq[d] += ds * k[d];
                dk[d] += ds_scaled * q[d];
                dv[d] += p * dyi[d];
              }
            }
            T* dqi = dx + q_off;
            for (int64_t d = 0; d < D; ++d) dqi[d] = sc * dq[d];
          }
        }
      }
    }
  });
}

}  // namespace ingot::cpu
