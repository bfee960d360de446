// AdamW (torch.optim.AdamW semantics) with global-norm clipping, over whole flat buffers.
// Invariants:
//   - The update follows ops.h operation by operation:
//       g = grad * (clip / divisor); p *= 1 - lr*wd (decayed runs only); m = b1 m + (1-b1) g;
//       v = b2 v + (1-b2) g^2; p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
//     The scalars arrive in f64 (the host formed them in double, as torch does with Python-float
//     hyperparameters) and are rounded once to the compute dtype.
//   - f64 params (the fp64 test recipe) update in f64 with every tensor f64. Otherwise the
//     arithmetic is f32: on the f32 master copy when there is one (params, f32/bf16/f16, receive
//     its rounded copy), else on params read as f32 and stored rounded; grads f32, bf16 or f16; m
//     and v both f32 or both bf16, stored rounded after the update has used them. Rounding is to
//     nearest, or stochastic for the bf16 stores that carry the update when asked (ops.h), with
//     the draws of core/stochastic_rounding.h: the same bits as the CUDA twin's.
//   - The sum of squares adds fixed-size chunks in double in chunk order, so the result is
//     bit-identical for any thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ingot/core/stochastic_rounding.h"
#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {
namespace {

// Element access for the dtypes a gradient or parameter may have.
template <typename T>
struct Elem {
  static T load(const void* p, int64_t i) { return static_cast<const T*>(p)[i]; }
  static void store(void* p, int64_t i, T x) { static_cast<T*>(p)[i] = x; }
};
struct Bf16Elem {
  static float load(const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, float x) { static_cast<uint16_t*>(p)[i] = f32_to_bf16(x); }
};
struct F16Elem {
  static float load(const void* p, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, int64_t i, float x) { static_cast<uint16_t*>(p)[i] = f32_to_f16(x); }
};

// E::store, except that a bf16 store with `stochastic` set rounds with the 16 bits `random16`.
template <typename E>
void store_rounded(void* p, int64_t i, float x, bool stochastic, uint32_t random16) {
  if constexpr (std::is_same_v<E, Bf16Elem>) {
    if (stochastic) {
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      static_cast<uint16_t*>(p)[i] = bf16_bits_stochastic(bits, random16);
      return;
    }
  }
  E::store(p, i, x);
}

template <typename Fn>
void dispatch_storage(const char* op, const char* name, DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn(Elem<float>{});
    case DType::bf16: return fn(Bf16Elem{});
    case DType::f16: return fn(F16Elem{});
    default: fail(op, ": ", name, " dtype ", dtype_name(dtype), " is not f32, bf16 or f16");
  }
}

// One element of the update on p (compute dtype T); returns the new p.
template <typename T>
inline T adamw_element(T p, T g, T& m, T& v, T grad_scale, T decay, T b1, T b2, T step_size,
                       T bc2_sqrt, T eps) {
  g = g * grad_scale;
  p = p * decay;
  m = b1 * m + (T(1) - b1) * g;
  v = b2 * v + (T(1) - b2) * g * g;
  return p - step_size * m / (std::sqrt(v) / bc2_sqrt + eps);
}

// sum(x^2) in double, in a fixed chunk order.
double sum_squares(Context& ctx, Tensor x) {
  constexpr const char* op = "sum_squares";
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  INGOT_CHECK(x.present() && x.device == Device::cpu, op, ": x must be a present host tensor");
  constexpr int64_t kChunk = 4096;  // fixed, so the summation order ignores the thread count
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(n_chunks));
  auto run = [&](auto load) {
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t end = std::min(n, (c + 1) * kChunk);
      double lane[8] = {};
      for (int64_t i = c * kChunk; i < end; ++i) {
        const double e = load(i);
        lane[i & 7] += e * e;
      }
      partial[c] = ((lane[0] + lane[4]) + (lane[2] + lane[6])) +
                   ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    }
  };
  switch (x.dtype) {
    case DType::f32: run([p = x.ptr<float>()](int64_t i) { return double(p[i]); }); break;
    case DType::f64: run([p = x.ptr<double>()](int64_t i) { return p[i]; }); break;
    case DType::bf16:
      run([p = x.ptr<uint16_t>()](int64_t i) { return double(bf16_to_f32(p[i])); });
      break;
    case DType::f16:
      run([p = x.ptr<uint16_t>()](int64_t i) { return double(f16_to_f32(p[i])); });
      break;
    default: fail(op, ": unsupported dtype ", dtype_name(x.dtype), " on the CPU backend");
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

// The element ranges [begin, end) with their decay flag, covering [0, n) in order.
struct DecayRange {
  int64_t begin, end;
  bool decays;
};

std::vector<DecayRange> decay_ranges(const Tensor& decay_runs, int64_t n) {
  constexpr const char* op = "adamw_step";
  detail::check_tensor(op, "decay_runs", decay_runs, DType::i64);
  INGOT_CHECK(decay_runs.ndim == 2 && decay_runs.dim(1) == 2, op, ": decay_runs must be (R,2), got ",
              decay_runs.shape_string());
  const int64_t* runs = decay_runs.ptr<int64_t>();
  std::vector<DecayRange> ranges;
  int64_t previous = 0;
  for (int64_t r = 0; r < decay_runs.dim(0); ++r) {
    const int64_t b = runs[2 * r], e = runs[2 * r + 1];
    INGOT_CHECK(b >= previous && b <= e && e <= n, op, ": decay_runs[", r, "] = [", b, ", ", e,
                ") is not sorted, disjoint and inside [0, ", n, ")");
    if (b > previous) ranges.push_back({previous, b, false});
    if (e > b) ranges.push_back({b, e, true});
    previous = e;
  }
  if (n > previous) ranges.push_back({previous, n, false});
  return ranges;
}

}  // namespace

void adamw_step(Context& ctx, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor master,
                Tensor decay_runs, Tensor scalars, const AdamWConstants& constants) {
  constexpr const char* op = "adamw_step";
  const int64_t n = params.numel();
  detail::check_tensor(op, "scalars", scalars, DType::f64);
  detail::check_numel(op, "scalars", scalars, ops::kAdamWSlots);
  detail::check_numel(op, "grads", grads, n);
  detail::check_numel(op, "m", m, n);
  detail::check_numel(op, "v", v, n);
  INGOT_CHECK(params.present() && params.device == Device::cpu && grads.present() && grads.device == Device::cpu,
              op, ": params and grads must be host tensors");
  const std::vector<DecayRange> ranges = decay_ranges(decay_runs, n);
  double* s = scalars.ptr<double>();
  const double divisor = s[ops::kAdamWGradDivisor];
  INGOT_CHECK(divisor > 0, op, ": gradient divisor ", divisor, " must be positive");
  s[ops::kAdamWSumSquares] = sum_squares(ctx, grads);
  const double norm = std::sqrt(s[ops::kAdamWSumSquares]) / divisor;
  s[ops::kAdamWGradNorm] = norm;
  // torch.nn.utils.clip_grad_norm_: coefficient max/(norm+1e-6), clamped to 1.
  const double max_norm = s[ops::kAdamWMaxGradNorm];
  const double clip = max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
  const double grad_scale = clip / divisor;
  if (n == 0) return;

  if (params.dtype == DType::f64) {  // the fp64 test recipe: every tensor f64, no master
    INGOT_CHECK(!master.present(), op, ": an f64 run has no master copy");
    detail::check_tensor(op, "params", params, DType::f64);
    detail::check_tensor(op, "grads", grads, DType::f64);
    detail::check_tensor(op, "m", m, DType::f64);
    detail::check_tensor(op, "v", v, DType::f64);
    double* p = params.ptr<double>();
    const double* g = grads.ptr<double>();
    double* mm = m.ptr<double>();
    double* vv = v.ptr<double>();
    const double step = s[ops::kAdamWStepSize], bc2 = s[ops::kAdamWBiasCorrection2];
    for (const DecayRange& r : ranges) {
      const double decay = r.decays ? s[ops::kAdamWDecay] : 1.0;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
      for (int64_t i = r.begin; i < r.end; ++i)
        p[i] = adamw_element<double>(p[i], g[i], mm[i], vv[i], grad_scale, decay, constants.beta1, constants.beta2,
                                     step, bc2, constants.eps);
    }
    return;
  }

  // f32 arithmetic on any storage: the update runs on master when present (params then receive its
  // rounded copy), otherwise on params read as f32; m and v are read as f32 and their new values
  // stored rounded after the update has used them.
  INGOT_CHECK(m.present() && v.present() && m.device == Device::cpu && v.device == Device::cpu, op,
              ": m and v must be host tensors");
  INGOT_CHECK((m.dtype == DType::f32 || m.dtype == DType::bf16) && v.dtype == m.dtype, op,
              ": m and v must both be f32 or both bf16, got ", dtype_name(m.dtype), " and ", dtype_name(v.dtype));
  const bool stochastic = adamw_draws(constants.stochastic_rounding, m.dtype == DType::bf16,
                                      params.dtype == DType::bf16, master.present());
  uint64_t update_number = 0;
  if (stochastic) {
    const double t = s[ops::kAdamWUpdate];
    INGOT_CHECK(t >= 1 && t < 9.007199254740992e15 && t == std::floor(t), op, ": update number ", t,
                " (scalars slot kAdamWUpdate) must be a whole number >= 1 with stochastic rounding");
    update_number = static_cast<uint64_t>(t);
  }
  float* w = nullptr;
  if (master.present()) {
    detail::check_tensor(op, "master", master, DType::f32);
    detail::check_numel(op, "master", master, n);
    w = master.ptr<float>();
  }
  dispatch_storage(op, "params", params.dtype, [&](auto param_elem) {
    dispatch_storage(op, "grads", grads.dtype, [&](auto grad_elem) {
      dispatch_storage(op, "m", m.dtype, [&](auto state_elem) {
        using P = decltype(param_elem);
        using G = decltype(grad_elem);
        using S = decltype(state_elem);
        const float gs = float(grad_scale), b1 = float(constants.beta1), b2 = float(constants.beta2),
                    step = float(s[ops::kAdamWStepSize]), bc2 = float(s[ops::kAdamWBiasCorrection2]),
                    eps = float(constants.eps);
        const uint64_t stream = stochastic ? rounding_stream(constants.rounding_seed, update_number) : 0;
        // Master or not is decided once, not per element.
        auto update = [&](auto has_master) {
          for (const DecayRange& r : ranges) {
            const float decay = r.decays ? float(s[ops::kAdamWDecay]) : 1.f;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
            for (int64_t i = r.begin; i < r.end; ++i) {
              float mi = float(S::load(m.data, i)), vi = float(S::load(v.data, i));
              float p;
              if constexpr (decltype(has_master)::value) p = w[i];
              else p = float(P::load(params.data, i));
              p = adamw_element<float>(p, float(G::load(grads.data, i)), mi, vi, gs, decay, b1, b2, step, bc2, eps);
              const uint64_t draw = stochastic ? rounding_bits(stream, uint64_t(i)) : 0;
              store_rounded<S>(m.data, i, mi, stochastic, rounding_draw(draw, RoundingDraw::m));
              store_rounded<S>(v.data, i, vi, stochastic, rounding_draw(draw, RoundingDraw::v));
              if constexpr (decltype(has_master)::value) {
                w[i] = p;
                P::store(params.data, i, p);  // a copy of master: to nearest
              } else {
                store_rounded<P>(params.data, i, p, stochastic, rounding_draw(draw, RoundingDraw::params));
              }
            }
          }
        };
        if (w) update(std::true_type{});
        else update(std::false_type{});
      });
    });
  });
}

}  // namespace ingot::cpu
