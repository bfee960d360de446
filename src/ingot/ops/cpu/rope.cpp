// Rotary position embedding, Hugging Face "rotate half" layout, in place on x (N,Htot,D).
// Invariants: heads [0, rotated_heads) are rotated (q and k heads lead the packed layout), the
// others untouched; angle = positions[n] * inv_freq[i] computed in the compute dtype, as HF does
// in float32; the backward applies the inverse (transpose) rotation, so it is exact to rounding.
#include <cmath>
#include <vector>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {
namespace {

// direction +1: forward rotation; -1: inverse rotation (the backward).
void rope_apply(const char* op, Context& ctx, Tensor x, Tensor positions, Tensor inv_freq,
                int rotated_heads, int direction) {
  detail::dispatch_float(op, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    detail::check_tensor(op, "x", x, x.dtype);
    detail::check_tensor(op, "positions", positions, DType::i32);
    detail::check_tensor(op, "inv_freq", inv_freq, ops::compute_dtype(x.dtype));
    INGOT_CHECK(x.ndim >= 3, op, ": x must be (N,Htot,D), got ", x.shape_string());
    const int64_t Htot = x.dim(-2), D = x.dim(-1), N = x.numel() / (Htot * D), half = D / 2;
    INGOT_CHECK(D % 2 == 0, op, ": head dim ", D, " must be even");
    INGOT_CHECK(rotated_heads >= 0 && rotated_heads <= Htot, op, ": rotated_heads ",
                rotated_heads, " is outside [0, ", Htot, "]");
    detail::check_numel(op, "positions", positions, N);
    detail::check_numel(op, "inv_freq", inv_freq, half);
    const int32_t* pos = positions.ptr<int32_t>();
    const T* freq = inv_freq.ptr<T>();
    T* data = x.ptr<T>();
    const T sign = static_cast<T>(direction);
#pragma omp parallel num_threads(ctx.num_threads)
    {
      std::vector<T> cos_row(static_cast<size_t>(half)), sin_row(static_cast<size_t>(half));
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const T p = static_cast<T>(pos[n]);
        for (int64_t i = 0; i < half; ++i) {
          const T angle = p * freq[i];
          cos_row[i] = std::cos(angle);
          sin_row[i] = sign * std::sin(angle);
        }
        for (int64_t h = 0; h < rotated_heads; ++h) {
          T* lo = data + (n * Htot + h) * D;
          T* hi = lo + half;
          for (int64_t i = 0; i < half; ++i) {
            const T a = lo[i], b = hi[i];
            lo[i] = a * cos_row[i] - b * sin_row[i];
            hi[i] = b * cos_row[i] + a * sin_row[i];
          }
        }
      }
    }
  });
}

}  // namespace

void rope_forward(Context& ctx, Tensor x, Tensor positions, Tensor inv_freq, int rotated_heads) {
  rope_apply("rope_forward", ctx, x, positions, inv_freq, rotated_heads, +1);
}

void rope_backward(Context& ctx, Tensor dx, Tensor positions, Tensor inv_freq, int rotated_heads) {
  rope_apply("rope_backward", ctx, dx, positions, inv_freq, rotated_heads, -1);
}

}  // namespace ingot::cpu
