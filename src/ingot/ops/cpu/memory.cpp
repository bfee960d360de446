// Memory ops on host tensors: zero, copy (with dtype conversion), add_inplace.
// Invariants: copy between equal dtypes is a byte copy (NaN payloads survive); conversions go
// through double, which holds every f32/bf16/f16/i32 value exactly; float -> i32 truncates toward
// zero like a C cast; narrowing to bf16/f16 rounds to nearest even (via f32).
#include <cstring>
#include <type_traits>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {
namespace {

template <DType D> struct Storage;
template <> struct Storage<DType::f32> { using type = float; };
template <> struct Storage<DType::f64> { using type = double; };
template <> struct Storage<DType::bf16> { using type = uint16_t; };
template <> struct Storage<DType::f16> { using type = uint16_t; };
template <> struct Storage<DType::i32> { using type = int32_t; };

template <DType D>
inline double load(typename Storage<D>::type x) {
  if constexpr (D == DType::bf16) return bf16_to_f32(x);
  else if constexpr (D == DType::f16) return f16_to_f32(x);
  else return static_cast<double>(x);
}

template <DType D>
inline typename Storage<D>::type store(double x) {
  if constexpr (D == DType::bf16) return f32_to_bf16(static_cast<float>(x));
  else if constexpr (D == DType::f16) return f32_to_f16(static_cast<float>(x));
  else return static_cast<typename Storage<D>::type>(x);
}

// Calls fn(std::integral_constant<DType, D>) for the dtypes copy converts between.
template <typename Fn>
void dispatch_copy_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(std::integral_constant<DType, DType::f32>{});
    case DType::f64: return fn(std::integral_constant<DType, DType::f64>{});
    case DType::bf16: return fn(std::integral_constant<DType, DType::bf16>{});
    case DType::f16: return fn(std::integral_constant<DType, DType::f16>{});
    case DType::i32: return fn(std::integral_constant<DType, DType::i32>{});
    default: fail("copy: cannot convert dtype ", dtype_name(dtype), " on the CPU backend");
  }
}

}  // namespace

void zero(Context& ctx, Tensor x) {
  if (x.numel() == 0) return;
  INGOT_CHECK(x.present() && x.device == Device::cpu, "zero: x must be a present host tensor");
  std::memset(x.data, 0, static_cast<size_t>(x.bytes()));
}

// dst (n) <- src (n), converting dtype.
void copy(Context& ctx, Tensor dst, Tensor src) {
  INGOT_CHECK(dst.numel() == src.numel(), "copy: dst ", dst.shape_string(), " and src ",
              src.shape_string(), " differ in element count");
  if (dst.numel() == 0) return;
  INGOT_CHECK(dst.present() && src.present(), "copy: dst and src must be present");
  INGOT_CHECK(dst.device == Device::cpu && src.device == Device::cpu,
              "copy: the CPU backend copies host tensors only");
  const int64_t n = dst.numel();
  if (dst.dtype == src.dtype) {
    std::memmove(dst.data, src.data, static_cast<size_t>(dst.bytes()));
    return;
  }
  dispatch_copy_dtype(dst.dtype, [&](auto dst_tag) {
    dispatch_copy_dtype(src.dtype, [&](auto src_tag) {
      constexpr DType D = decltype(dst_tag)::value, S = decltype(src_tag)::value;
      auto* out = dst.ptr<typename Storage<D>::type>();
      const auto* in = src.ptr<typename Storage<S>::type>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
      for (int64_t i = 0; i < n; ++i) out[i] = store<D>(load<S>(in[i]));
    });
  });
}

// x (n) += y (n)
void add_inplace(Context& ctx, Tensor x, Tensor y) {
  detail::dispatch_float("add_inplace", x.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor("add_inplace", "x", x, x.dtype);
    detail::check_tensor("add_inplace", "y", y, x.dtype);
    detail::check_numel("add_inplace", "y", y, x.numel());
    const int64_t n = x.numel();
    T* a = x.ptr<T>();
    const T* b = y.ptr<T>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
  });
}

}  // namespace ingot::cpu
