// Helpers shared by the CPU ops (ops/cpu/*.cpp): dtype dispatch, argument checks and a
// deterministic dot product. Invariants:
//   - dispatch_float() calls its functor with T = float for f32 and T = double for f64 and fails,
//     naming the op and the dtype, for anything else.
//   - Checks run before any OpenMP region: an exception must never leave a parallel region.
//   - dot()/sum_squares_row() sum in a fixed order that depends only on n, never on threads.
#pragma once
#include <cmath>
#include <cstdint>

#include "ingot/ops/cpu/cpu_ops.h"

namespace ingot::cpu::detail {

template <typename Fn>
decltype(auto) dispatch_float(const char* op, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    default: break;
  }
  fail(op, ": unsupported dtype ", dtype_name(dtype), " on the CPU backend (f32 or f64 expected)");
}

// A present host tensor of the given dtype.
inline void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype) {
  INGOT_CHECK(t.present(), op, ": ", name, " is absent");
  INGOT_CHECK(t.device == Device::cpu, op, ": ", name, " is not a host tensor");
  INGOT_CHECK(t.dtype == dtype, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected ",
              dtype_name(dtype));
}

inline void check_numel(const char* op, const char* name, const Tensor& t, int64_t numel) {
  INGOT_CHECK(t.numel() == numel, op, ": ", name, " ", t.shape_string(), " has ", t.numel(),
              " elements, expected ", numel);
}

// Ids/targets in [0, limit) (or kIgnoreIndex when allow_ignore); checked serially up front.
inline void check_ids(const char* op, const char* name, const int32_t* ids, int64_t n,
                      int64_t limit, bool allow_ignore) {
  for (int64_t i = 0; i < n; ++i) {
    if (allow_ignore && ids[i] == ops::kIgnoreIndex) continue;
    INGOT_CHECK(ids[i] >= 0 && ids[i] < limit, op, ": ", name, "[", i, "] = ", ids[i],
                " is outside [0, ", limit, ")");
  }
}

// sum_i a[i]*b[i] with 8 interleaved partial sums (so GCC vectorises it without -ffast-math),
// combined in a fixed tree order.
template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) part[l] += a[i] * b[i];
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

// sum_i a[i]*b[i]*c[i], same fixed partial-sum order as dot().
template <typename T>
inline T dot3(const T* a, const T* b, const T* c, int64_t n) {
  T part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += a[i + l] * b[i + l] * c[i + l];
  for (int l = 0; i < n; ++i, ++l) part[l] += a[i] * b[i] * c[i];
  return ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
}

// One RMSNorm row: out (C) = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps). Returns rstd.
// Shared by rmsnorm (rows of the hidden state) and qk_norm (one head of one token).
template <typename T>
inline T rmsnorm_row_forward(T* out, const T* x, const T* w, int64_t C, T eps) {
  const T rstd = T(1) / std::sqrt(dot(x, x, C) / T(C) + eps);
  for (int64_t c = 0; c < C; ++c) out[c] = w[c] * (x[c] * rstd);
  return rstd;
}

// Gradient of one RMSNorm row wrt x:
//   dx_c = rstd*w_c*g_c - x_c * rstd^3/C * sum_k g_k w_k x_k
// written to dx (accumulate = false) or added to it (accumulate = true).
template <typename T>
inline void rmsnorm_row_backward(T* dx, const T* g, const T* x, const T* w, T rstd, int64_t C,
                                 bool accumulate) {
  const T coef = dot3(g, w, x, C) * (rstd * rstd * rstd) / T(C);
  if (accumulate)
    for (int64_t c = 0; c < C; ++c) dx[c] += rstd * w[c] * g[c] - coef * x[c];
  else
    for (int64_t c = 0; c < C; ++c) dx[c] = rstd * w[c] * g[c] - coef * x[c];
}

}  // namespace ingot::cpu::detail
