// Tests of the CPU backend ops, the numerical reference of the engine. One table of OpCases
// (op_harness.h) drives four checks per case; standalone tests cover accumulate semantics,
// aliasing, AdamW (adamw_step), sum_to, copy conversions, argument errors and matmul speed.
//
// Tolerances (norm-wise relative error ||a-b||/||b||; also listed in docs/ops.md):
//   backward vs central finite differences, float64, h = 1e-5 ........ <= 1e-6 (all ops)
//   float64 forward vs naive reference ............................... <= 1e-12
//   float32 vs float64 on the same inputs ............................ <= 1e-5
//   thread count 1 / 2 / 3 ........................................... bit-identical
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "ingot/core/stochastic_rounding.h"
#include "ingot/ops/ops.h"
#include "op_harness.h"
#include "test_util.h"

namespace ingot::test {
namespace {

using ingot::ops::kIgnoreIndex;

Context cpu_context(int threads) {
  Context ctx;
  ctx.num_threads = threads;
  return ctx;
}

std::vector<Values> random_values(const std::vector<int64_t>& sizes, uint64_t seed) {
  std::vector<Values> v;
  for (size_t i = 0; i < sizes.size(); ++i) {
    v.emplace_back(static_cast<size_t>(sizes[i]));
    fill_normal(v.back(), seed * 1000 + i);
  }
  return v;
}

// Output gradients: random weights of the objective sum(out * w), one per differentiable output.
std::vector<Values> random_douts(const OpCase& c, const OpResult& forward, uint64_t seed) {
  std::vector<Values> w;
  for (int o = 0; o < c.differentiable_outputs; ++o) {
    w.emplace_back(forward.outputs[o].size());
    fill_normal(w.back(), seed + 77 + o);
    if (c.uniform_dout) std::fill(w.back().begin(), w.back().end(), 0.37);
  }
  return w;
}

double objective(const OpResult& r, const std::vector<Values>& w) {
  double total = 0;
  for (size_t o = 0; o < w.size(); ++o)
    for (size_t e = 0; e < w[o].size(); ++e) total += r.outputs[o][e] * w[o][e];
  return total;
}

// Errors recorded as gtest properties (--gtest_output=xml) so tolerance margins can be read off.
std::string scientific(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2e", x);
  return text;
}

bool bit_identical(const Values& a, const Values& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// ---- naive float64 references -----------------------------------------------------------------

Values rmsnorm_reference(const Values& x, const Values& w, int64_t R, int64_t C, double eps,
                         Values* rstd) {
  Values y(x.size());
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[r * C + c] * x[r * C + c];
    const double s = 1.0 / std::sqrt(ss / C + eps);
    if (rstd) rstd->push_back(s);
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = w[c] * x[r * C + c] * s;
  }
  return y;
}

// Full (T,T) score matrix per (b, h), masked, softmaxed, times V.
std::vector<Values> attention_reference(const Values& qkv, const std::vector<int32_t>& seg,
                                        int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                        double scale) {
  const int64_t Htot = Hq + 2 * Hkv;
  Values out(B * T * Hq * D, 0.0), lse(B * Hq * T, 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t d) {
    return qkv[((b * T + t) * Htot + h) * D + d];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      std::vector<Values> P(T, Values(T, 0.0));
      for (int64_t i = 0; i < T; ++i) {
        double max = -INFINITY;
        Values s(T, -INFINITY);
        for (int64_t j = 0; j < T; ++j) {
          const bool allowed = j <= i && (seg.empty() || seg[b * T + i] == seg[b * T + j]);
          if (!allowed) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += at(b, i, h, d) * at(b, j, Hq + g, d);
          s[j] = scale * dot;
          max = std::max(max, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j) sum += std::exp(s[j] - max);  // exp(-inf) = 0
        for (int64_t j = 0; j < T; ++j) P[i][j] = std::exp(s[j] - max) / sum;
        lse[(b * Hq + h) * T + i] = max + std::log(sum);
      }
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < T; ++j) acc += P[i][j] * at(b, j, Hq + Hkv + g, d);
          out[((b * T + i) * Hq + h) * D + d] = acc;
        }
    }
  return {out, lse};
}

// ---- cases ------------------------------------------------------------------------------------

OpCase embedding_case(int64_t V, int64_t C, std::vector<int32_t> ids, bool fd = true) {
  const int64_t N = static_cast<int64_t>(ids.size());
  OpCase c;
  c.name = "embedding_V" + std::to_string(V) + "_C" + std::to_string(C) + "_N" + std::to_string(N);
  c.input_sizes = {V * C};
  c.finite_differences = fd;
  c.run = [=](Context& ctx, DType dt, const std::vector<Values>& in, const std::vector<Values>* dout) {
    IntBuffer id(ids, {N});
    Buffer table(dt, {V, C}, &in[0]), out(dt, {N, C});
    ops::embedding_forward(ctx, out.t, id.t, table.t);
    OpResult r{{out.values()}, {}};
    if (dout) {
      Buffer g(dt, {N, C}, &(*dout)[0]), dtable(dt, {V, C});
      ops::embedding_backward(ctx, dtable.t, g.t, id.t);
      r.grads = {dtable.values()};
    }
    return r;
  };
  c.reference = [=](const std::vector<Values>& in) {
    Values out(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < C; ++k) out[n * C + k] = in[0][ids[n] * C + k];
    return std::vector<Values>{out};
  };
  return c;
}

OpCase rmsnorm_case(int64_t R, int64_t C, bool fd = true) {
  const double eps = 1e-5;
  OpCase c;
  c.name = "rmsnorm_R" + std::to_string(R) + "_C" + std::to_string(C);
  c.input_sizes = {R * C, C};
  c.finite_differences = fd;
  c.run = [=](Context& ctx, DType dt, const std::vector<Values>& in, const std::vector<Values>* dout) {
    Buffer x(dt, {R, C}, &in[0]), w(dt, {C}, &in[1]), y(dt, {R, C}), rstd(dt, {R});
    ops::rmsnorm_forward(ctx, y.t, rstd.t, x.t, w.t, eps);
    OpResult r{{y.values(), rstd.values()}, {}};
    if (dout) {
      Buffer g(dt, {R, C}, &(*dout)[0]), dx(dt, {R, C}), dw(dt, {C});
      ops::rmsnorm_backward(ctx, dx.t, dw.t, g.t, x.t, w.t, rstd.t);
      r.grads = {dx.values(), dw.values()};
    }
    return r;
  };
  c.reference = [=](const std::vector<Values>& in) {
    Values rstd;
    Values y = rmsnorm_reference(in[0], in[1], R, C, eps, &rstd);
    return std::vector<Values>{y, rstd};
  };
  return c;
}

OpCase qk_norm_case(int64_t N, int64_t Hq, int64_t Hkv, int64_t D) {
  const double eps = 1e-6;
  const int64_t Htot = Hq + 2 * Hkv;
  OpCase c;
  c.name = "qk_norm_N" + std::to_string(N) + "_Hq" + std::to_string(Hq) + "_Hkv" +
           std::to_string(Hkv) + "_D" + std::to_string(D);
  c.input_sizes = {N * Htot * D, D, D};
  c.run = [=](Context& ctx, DType dt, const std::vector<Values>& in, const std::vector<Values>* dout) {
    Buffer x(dt, {N, Htot, D}, &in[0]), wq(dt, {D}, &in[1]), wk(dt, {D}, &in[2]);
    Buffer y(dt, {N, Htot, D}), rstd(dt, {N, Hq + Hkv});
    ops::qk_norm_forward(ctx, y.t, rstd.t, x.t, wq.t, wk.t, int(Hq), int(Hkv), eps);
    OpResult r{{y.values(), rstd.values()}, {}};
    if (dout) {
      Buffer g(dt, {N, Htot, D}, &(*dout)[0]), dx(dt, {N, Htot, D}), dwq(dt, {D}), dwk(dt, {D});
      ops::qk_norm_backward(ctx, dx.t, dwq.t, dwk.t, g.t, x.t, wq.t, wk.t, rstd.t, int(Hq), int(Hkv));
      r.grads = {dx.values(), dwq.values(), dwk.values()};
    }
    return r;
  };
  c.reference = [=](const std::vector<Values>& in) {
    Values y(in[0].size()), rstd;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < Htot; ++h) {
        const int64_t off = (n * Htot + h) * D;
        Values head(in[0].begin() + off, in[0].begin() + off + D);
        Values out = h < Hq + Hkv ? rmsnorm_reference(head, h < Hq ? in[1] : in[2], 1, D, eps, &rstd)
                                  : head;
        std::copy(out.begin(), out.end(), y.begin() + off);
      }
    return std::vector<Values>{y, rstd};
  };
  return c;
}

OpCase linear_case(int64_t N, int64_t I, int64_t O, bool bias, bool fd = true) {
  OpCase c;
  c.name = std::string("linear") + (bias ? "_bias" : "") + "_N" + std::to_string(N) + "_I" +
           std::to_string(I) + "_O" + std::to_string(O);
  c.input_sizes = {N * I, O * I};
  if (bias) c.input_sizes.push_back(O);
  c.finite_differences = fd;
  c.run = [=](Context& ctx, DType dt, const std::vector<Values>& in, const std::vector<Values>* dout) {
    Buffer x(dt, {N, I}, &in[0]), w(dt, {O, I}, &in[1]), y(dt, {N, O});
    Buffer b(dt, {bias ? O : 1}, bias ? &in[2] : nullptr);
    Tensor bias_t = bias ? b.t : Tensor();
    ops::linear_forward(ctx, y.t, x.t, w.t, bias_t);
    OpResult r{{y.values()}, {}};
    if (dout) {
      Buffer g(dt, {N, O}, &(*dout)[0]), dx(dt, {N, I}), dw(dt, {O, I}), db(dt, {bias ? O : 1});
      ops::linear_backward(ctx, dx.t, dw.t, bias ? db.t : Tensor(), g.t, x.t, w.t);
      r.grads = {dx.values(), dw.values()};
      if (bias) r.grads.push_back(db.values());
    }
    return r;
  };
  c.reference = [=](const std::vector<Values>& in) {
    Values y(N * O);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double acc = bias ? in[2][o] : 0.0;
        for (int64_t i = 0; i < I; ++i) acc += in[0][n * I + i] * in[1][o * I + i];
        y[n * O + o] = acc;
      }
    return std::vector<Values>{y};
  };
  c.reference_tol = 1e-13;
  return c;
}

OpCase rope_case(int64_t N, int64_t Htot, int64_t rotated, int64_t D) {
  std::vector<int32_t> pos(N);
  for (int64_t n = 0; n < N; ++n) pos[n] = static_cast<int32_t>((n * 37) % 1000);  // up to ~1000
  Values inv_freq(D / 2);
  for (int64_t i = 0; i < D / 2; ++i) inv_freq[i] = 1.0 / std::pow(10000.0, 2.0 * i / D);
  OpCase c;
  c.name = "rope_N" + std::to_string(N) + "_Htot" + std::to_string(Htot) + "_rot" +
           std::to_string(rotated) + "_D" + std::to_string(D);
  c.input_sizes = {N * Htot * D};
  c.run = [=](Context& ctx, DType dt, const std::vector<Values>& in, const std::vector<Values>* dout) {
    IntBuffer p(pos, {N});
    Buffer x(dt, {N, Htot, D}, &in[0]), f(dt, {D / 2}, &inv_freq);
    ops::rope_forward(ctx, x.t, p.t, f.t, int(rotated));
    OpResult r{{x.values()}, {}};
    if (dout) {
      Buffer g(dt, {N, Htot, D}, &(*dout)[0]);
      ops::rope_backward(ctx, g.t, p.t, f.t, int(rotated));
      r.grads = {g.values()};
    }
    return r;
  };
  c.reference = [=](const std::vector<Values>& in) {
    Values y = in[0];
    const int64_t half = D / 2;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < rotated; ++h)
        for (int64_t i = 0; i < D; ++i) {
          // HF: q * cos + rotate_half(q) * sin with cos/sin duplicated over both halves.
          const double angle = pos[n] * inv_freq[i % half];
          const int64_t off = (n * Htot + h) * D;
          const double rotated_half = i < half ? -in[0][off + i + half] : in[0][off + i - half];
          y[off + i] = in[0][off + i] * std::cos(angle) + rotated_half * std::sin(angle);
        }
    return std::vector<Values>{y};
  };
  c.reference_tol = 1e-12;
  return c;
}

OpCase attention_case(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, bool segments,
                      bool fd = true) {
  const int64_t Htot = Hq + 2 * Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<int32_t> seg;
  if (segments)  // packed documents of varying length, ids restart per row
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) seg.push_back(static_cast<int32_t>((t + b) / 3 + b % 2));
  OpCase c;
  c.name = std::string("attention") + (Hq == Hkv ? "_mha" : "_gqa") + (segments ? "_seg" : "") +
           "_B" + std::to_string(B) + "_T" + std::to_string(T) + "_Hq" + std::to_string(Hq) +
           "_Hkv" + std::to_string(Hkv) + "_D" + std::to_string(D);
  c.input_sizes = {B * T * Htot * D};
  c.finite_differences = fd;
  c.run = [=](Context& ctx, DType dt, const std::vector<Values>& in, const std::vector<Values>* dout) {
    IntBuffer s(segments ? seg : std::vector<int32_t>{0}, {segments ? B * T : 1});
    Tensor seg_t = segments ? s.t : Tensor();
    Buffer qkv(dt, {B, T, Htot, D}, &in[0]), out(dt, {B, T, Hq, D}), lse(dt, {B, Hq, T});
    ops::attention_forward(ctx, out.t, lse.t, qkv.t, seg_t, int(Hq), int(Hkv), scale);
    OpResult r{{out.values(), lse.values()}, {}};
    if (dout) {
      Buffer g(dt, {B, T, Hq, D}, &(*dout)[0]), dqkv(dt, {B, T, Htot, D});
      ops::attention_backward(ctx, dqkv.t, g.t, out.t, lse.t, qkv.t, seg_t, int(Hq), int(Hkv), scale);
      r.grads = {dqkv.values()};
    }
    return r;
  };
  c.reference = [=](const std::vector<Values>& in) {
    return attention_reference(in[0], seg, B, T, Hq, Hkv, D, scale);
  };
  return c;
}

OpCase swiglu_case(int64_t N, int64_t F) {
  OpCase c;
  c.name = "swiglu_N" + std::to_string(N) + "_F" + std::to_string(F);
  c.input_sizes = {N * 2 * F};
  c.run = [=](Context& ctx, DType dt, const std::vector<Values>& in, const std::vector<Values>* dout) {
    Buffer x(dt, {N, 2 * F}, &in[0]), y(dt, {N, F});
    ops::swiglu_forward(ctx, y.t, x.t);
    OpResult r{{y.values()}, {}};
    if (dout) {
      Buffer g(dt, {N, F}, &(*dout)[0]), dx(dt, {N, 2 * F});
      ops::swiglu_backward(ctx, dx.t, g.t, x.t);
      r.grads = {dx.values()};
    }
    return r;
  };
  c.reference = [=](const std::vector<Values>& in) {
    Values y(N * F);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f) {
        const double g = in[0][n * 2 * F + f], u = in[0][n * 2 * F + F + f];
        y[n * F + f] = g / (1 + std::exp(-g)) * u;
      }
    return std::vector<Values>{y};
  };
  return c;
}

// Targets include kIgnoreIndex rows; the objective is dloss_scale * sum(losses).
OpCase cross_entropy_case(int64_t N, int64_t V, bool fd = true) {
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n)
    targets[n] = n % 3 == 1 ? kIgnoreIndex : static_cast<int32_t>((n * 7 + 3) % V);
  OpCase c;
  c.name = "cross_entropy_N" + std::to_string(N) + "_V" + std::to_string(V);
  c.input_sizes = {N * V};
  c.uniform_dout = true;
  c.finite_differences = fd;
  c.run = [=](Context& ctx, DType dt, const std::vector<Values>& in, const std::vector<Values>* dout) {
    IntBuffer t(targets, {N});
    Buffer logits(dt, {N, V}, &in[0]), losses(dt, {N}), dlogits(dt, {N, V});
    ops::cross_entropy(ctx, losses.t, Tensor(), logits.t, t.t, 0.0);
    OpResult r{{losses.values()}, {}};
    if (dout) {
      Buffer losses2(dt, {N});
      ops::cross_entropy(ctx, losses2.t, dlogits.t, logits.t, t.t, (*dout)[0][0]);
      r.grads = {dlogits.values()};
      EXPECT_TRUE(bit_identical(losses2.values(), r.outputs[0]))
          << "losses differ with and without dlogits";
    }
    return r;
  };
  c.reference = [=](const std::vector<Values>& in) {
    Values losses(N, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (targets[n] == kIgnoreIndex) continue;
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(in[0][n * V + v]);
      losses[n] = std::log(sum) - in[0][n * V + targets[n]];
    }
    return std::vector<Values>{losses};
  };
  return c;
}

std::vector<OpCase> all_cases() {
  return {
      embedding_case(11, 6, {3, 0, 3, 10, 7, 3, 0, 5, 10}),
      embedding_case(50, 70, std::vector<int32_t>(300, 0), false),
      rmsnorm_case(5, 12),
      rmsnorm_case(64, 200, false),
      qk_norm_case(3, 4, 2, 6),
      qk_norm_case(5, 2, 1, 20),
      linear_case(7, 13, 37, false),   // crosses the 6-row and 32-column tiles
      linear_case(5, 9, 4, true),
      linear_case(3, 300, 5, false),   // K > 256: two k chunks
      linear_case(70, 300, 75, true, false),
      rope_case(4, 6, 4, 8),
      rope_case(3, 5, 3, 6),
      attention_case(2, 6, 2, 2, 4, false),    // MHA
      attention_case(2, 6, 2, 2, 4, true),     // MHA, document masking
      attention_case(2, 7, 4, 2, 3, false),    // GQA, D = 3 unrelated to any hidden size
      attention_case(1, 9, 6, 2, 5, true),     // GQA, document masking
      attention_case(2, 40, 4, 2, 16, true, false),
      swiglu_case(4, 7),
      cross_entropy_case(6, 10),
      cross_entropy_case(40, 301, false),
  };
}

// The large embedding case above uses all-zero ids; give it repeated random ids instead.
std::vector<OpCase> cases_with_random_ids() {
  auto cases = all_cases();
  std::mt19937 rng(5);
  std::vector<int32_t> ids(300);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 50);
  cases[1] = embedding_case(50, 70, ids, false);
  return cases;
}

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> table = cases_with_random_ids();
  return table;
}

// ---- the four harness checks ------------------------------------------------------------------

class CpuOpCase : public ::testing::TestWithParam<size_t> {
 protected:
  const OpCase& op() const { return cases()[GetParam()]; }
  uint64_t seed() const { return 1234 + GetParam(); }
};

// The cases with a backward to check by finite differences (the others are forward/threads-only):
// instantiated on their own, so that no case reports a skip on every run.
class CpuOpBackwardCase : public CpuOpCase {};
std::vector<size_t> backward_case_indices() {
  std::vector<size_t> indices;
  for (size_t i = 0; i < cases().size(); ++i)
    if (cases()[i].finite_differences) indices.push_back(i);
  return indices;
}

// Backward (float64) vs central finite differences of sum(out * w), h = 1e-5.
TEST_P(CpuOpBackwardCase, BackwardMatchesFiniteDifferences) {
  const OpCase& c = op();
  ASSERT_TRUE(c.finite_differences);
  Context ctx = cpu_context(2);
  std::vector<Values> inputs = random_values(c.input_sizes, seed());
  const OpResult forward = c.run(ctx, DType::f64, inputs, nullptr);
  const std::vector<Values> w = random_douts(c, forward, seed());
  const OpResult analytic = c.run(ctx, DType::f64, inputs, &w);
  ASSERT_EQ(analytic.grads.size(), inputs.size());
  const double h = 1e-5;
  std::mt19937_64 rng(seed());
  for (size_t k = 0; k < inputs.size(); ++k) {
    std::vector<int64_t> coords(inputs[k].size());
    std::iota(coords.begin(), coords.end(), 0);
    std::shuffle(coords.begin(), coords.end(), rng);
    if (static_cast<int64_t>(coords.size()) > c.max_fd_coords) coords.resize(c.max_fd_coords);
    Values fd, an;
    for (int64_t e : coords) {
      const double saved = inputs[k][e];
      inputs[k][e] = saved + h;
      const double plus = objective(c.run(ctx, DType::f64, inputs, nullptr), w);
      inputs[k][e] = saved - h;
      const double minus = objective(c.run(ctx, DType::f64, inputs, nullptr), w);
      inputs[k][e] = saved;
      fd.push_back((plus - minus) / (2 * h));
      an.push_back(analytic.grads[k][e]);
    }
    const double err = relative_error(an, fd);
    RecordProperty("fd_error_input_" + std::to_string(k), scientific(err));
    EXPECT_LE(err, c.fd_tol) << c.name << ": gradient of input " << k;
  }
}

// Float64 forward (statistics included) vs a naive reference.
TEST_P(CpuOpCase, ForwardMatchesReference) {
  const OpCase& c = op();
  ASSERT_TRUE(c.reference) << c.name << " has no reference";
  Context ctx = cpu_context(2);
  const std::vector<Values> inputs = random_values(c.input_sizes, seed());
  const OpResult got = c.run(ctx, DType::f64, inputs, nullptr);
  const std::vector<Values> want = c.reference(inputs);
  ASSERT_EQ(got.outputs.size(), want.size());
  for (size_t o = 0; o < want.size(); ++o)
    EXPECT_LE(relative_error(got.outputs[o], want[o]), c.reference_tol) << c.name << ": output " << o;
}

// Float32 vs float64 on the same float-representable inputs, forward and backward.
TEST_P(CpuOpCase, FloatMatchesDouble) {
  const OpCase& c = op();
  Context ctx = cpu_context(2);
  std::vector<Values> inputs = random_values(c.input_sizes, seed());
  for (auto& v : inputs)
    for (auto& x : v) x = static_cast<float>(x);
  const OpResult fwd = c.run(ctx, DType::f64, inputs, nullptr);
  std::vector<Values> w = random_douts(c, fwd, seed());
  for (auto& v : w)
    for (auto& x : v) x = static_cast<float>(x);
  const OpResult d = c.run(ctx, DType::f64, inputs, &w);
  const OpResult f = c.run(ctx, DType::f32, inputs, &w);
  for (size_t o = 0; o < d.outputs.size(); ++o)
    EXPECT_LE(relative_error(f.outputs[o], d.outputs[o]), c.f32_tol) << c.name << ": output " << o;
  double worst = 0;
  for (size_t o = 0; o < d.outputs.size(); ++o)
    worst = std::max(worst, relative_error(f.outputs[o], d.outputs[o]));
  for (size_t k = 0; k < d.grads.size(); ++k)
    worst = std::max(worst, relative_error(f.grads[k], d.grads[k]));
  RecordProperty("f32_error", scientific(worst));
  for (size_t k = 0; k < d.grads.size(); ++k)
    EXPECT_LE(relative_error(f.grads[k], d.grads[k]), c.f32_tol) << c.name << ": gradient " << k;
}

// Same bits for 1, 2 and 3 threads (float32 and float64), forward and backward.
TEST_P(CpuOpCase, ThreadCountInvariant) {
  const OpCase& c = op();
  for (DType dt : {DType::f32, DType::f64}) {
    const std::vector<Values> inputs = random_values(c.input_sizes, seed());
    Context one = cpu_context(1);
    const OpResult fwd = c.run(one, dt, inputs, nullptr);
    const std::vector<Values> w = random_douts(c, fwd, seed());
    const OpResult base = c.run(one, dt, inputs, &w);
    for (int threads : {2, 3}) {
      Context ctx = cpu_context(threads);
      const OpResult r = c.run(ctx, dt, inputs, &w);
      for (size_t o = 0; o < base.outputs.size(); ++o)
        EXPECT_TRUE(bit_identical(r.outputs[o], base.outputs[o]))
            << c.name << " " << dtype_name(dt) << ": output " << o << " with " << threads << " threads";
      for (size_t k = 0; k < base.grads.size(); ++k)
        EXPECT_TRUE(bit_identical(r.grads[k], base.grads[k]))
            << c.name << " " << dtype_name(dt) << ": gradient " << k << " with " << threads << " threads";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, CpuOpCase, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return cases()[info.param].name;
                         });
INSTANTIATE_TEST_SUITE_P(Table, CpuOpBackwardCase, ::testing::ValuesIn(backward_case_indices()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return cases()[info.param].name;
                         });

// ---- accumulate semantics -----------------------------------------------------------------------

// Parameter gradients (and rmsnorm's din) accumulate: two backward calls give twice one call.
// Tolerance 1e-14 (float64): the second call adds the same value in a possibly different order.
TEST(CpuOps, ParameterGradientsAccumulate) {
  Context ctx = cpu_context(2);
  const int64_t N = 9, I = 300, O = 40, C = I;
  auto rnd = [](int64_t n, uint64_t seed) { Values v(n); fill_normal(v, seed); return v; };
  const Values x = rnd(N * I, 1), w = rnd(O * I, 2), g = rnd(N * O, 3), nw = rnd(C, 4), gn = rnd(N * C, 5);
  Buffer xb(DType::f64, {N, I}, &x), wb(DType::f64, {O, I}, &w), gb(DType::f64, {N, O}, &g);
  Buffer dx(DType::f64, {N, I}), dw(DType::f64, {O, I}), db(DType::f64, {O});
  ops::linear_backward(ctx, dx.t, dw.t, db.t, gb.t, xb.t, wb.t);
  const Values dx1 = dx.values(), dw1 = dw.values(), db1 = db.values();
  ops::linear_backward(ctx, dx.t, dw.t, db.t, gb.t, xb.t, wb.t);
  auto twice = [](Values v) { for (auto& e : v) e *= 2; return v; };
  EXPECT_TRUE(bit_identical(dx.values(), dx1)) << "linear din overwrites";
  EXPECT_LE(relative_error(dw.values(), twice(dw1)), 1e-14) << "linear dweight accumulates";
  EXPECT_LE(relative_error(db.values(), twice(db1)), 1e-14) << "linear dbias accumulates";
  // accumulate_dweight = false: dweight is overwritten, whatever it held (NaN here).
  Buffer dw_new(DType::f64, {O, I});
  std::fill_n(static_cast<double*>(dw_new.t.data), O * I, std::numeric_limits<double>::quiet_NaN());
  ops::linear_backward(ctx, Tensor(), dw_new.t, Tensor(), gb.t, xb.t, wb.t, /*accumulate_dweight=*/false);
  EXPECT_TRUE(bit_identical(dw_new.values(), dw1)) << "linear dweight overwrites";

  Buffer nwb(DType::f64, {C}, &nw), gnb(DType::f64, {N, C}, &gn), y(DType::f64, {N, C}), rstd(DType::f64, {N});
  ops::rmsnorm_forward(ctx, y.t, rstd.t, xb.t, nwb.t, 1e-6);
  Buffer dxn(DType::f64, {N, C}), dwn(DType::f64, {C});
  ops::rmsnorm_backward(ctx, dxn.t, dwn.t, gnb.t, xb.t, nwb.t, rstd.t);
  const Values dxn1 = dxn.values(), dwn1 = dwn.values();
  ops::rmsnorm_backward(ctx, dxn.t, dwn.t, gnb.t, xb.t, nwb.t, rstd.t);
  EXPECT_LE(relative_error(dxn.values(), twice(dxn1)), 1e-14) << "rmsnorm din accumulates";
  EXPECT_LE(relative_error(dwn.values(), twice(dwn1)), 1e-14) << "rmsnorm dweight accumulates";

  const std::vector<int32_t> ids = {1, 4, 1, 1, 0, 4, 2, 3, 1};
  IntBuffer idb(ids, {N});
  Buffer dtable(DType::f64, {5, C});
  ops::embedding_backward(ctx, dtable.t, gnb.t, idb.t);
  const Values dt1 = dtable.values();
  ops::embedding_backward(ctx, dtable.t, gnb.t, idb.t);
  EXPECT_LE(relative_error(dtable.values(), twice(dt1)), 1e-14) << "embedding dtable accumulates";

  // qk_norm: din overwrites, dq_weight/dk_weight accumulate. (N,Htot,D) = (3, 1+2*1, 100)
  const Values q = rnd(3 * 3 * 100, 6), wq = rnd(100, 7), wk = rnd(100, 8), gq = rnd(3 * 3 * 100, 9);
  Buffer qb(DType::f64, {3, 3, 100}, &q), wqb(DType::f64, {100}, &wq), wkb(DType::f64, {100}, &wk);
  Buffer gqb(DType::f64, {3, 3, 100}, &gq), yq(DType::f64, {3, 3, 100}), rq(DType::f64, {3, 2});
  ops::qk_norm_forward(ctx, yq.t, rq.t, qb.t, wqb.t, wkb.t, 1, 1, 1e-6);
  Buffer dq(DType::f64, {3, 3, 100}), dwq(DType::f64, {100}), dwk(DType::f64, {100});
  ops::qk_norm_backward(ctx, dq.t, dwq.t, dwk.t, gqb.t, qb.t, wqb.t, wkb.t, rq.t, 1, 1);
  const Values dq1 = dq.values(), dwq1 = dwq.values(), dwk1 = dwk.values();
  ops::qk_norm_backward(ctx, dq.t, dwq.t, dwk.t, gqb.t, qb.t, wqb.t, wkb.t, rq.t, 1, 1);
  EXPECT_TRUE(bit_identical(dq.values(), dq1)) << "qk_norm din overwrites";
  EXPECT_LE(relative_error(dwq.values(), twice(dwq1)), 1e-14);
  EXPECT_LE(relative_error(dwk.values(), twice(dwk1)), 1e-14);
}

// Activation gradients overwrite: poisoned outputs are fully rewritten.
TEST(CpuOps, ActivationGradientsOverwrite) {
  Context ctx = cpu_context(2);
  const int64_t B = 2, T = 5, Hq = 2, Hkv = 1, D = 4, Htot = Hq + 2 * Hkv;
  Values qkv(B * T * Htot * D), g(B * T * Hq * D);
  fill_normal(qkv, 11);
  fill_normal(g, 12);
  const Values poison(qkv.size(), std::nan(""));
  Buffer x(DType::f64, {B, T, Htot, D}, &qkv), out(DType::f64, {B, T, Hq, D}), lse(DType::f64, {B, Hq, T});
  Buffer gb(DType::f64, {B, T, Hq, D}, &g), dx(DType::f64, {B, T, Htot, D}, &poison);
  ops::attention_forward(ctx, out.t, lse.t, x.t, Tensor(), Hq, Hkv, 0.5);
  ops::attention_backward(ctx, dx.t, gb.t, out.t, lse.t, x.t, Tensor(), Hq, Hkv, 0.5);
  for (double v : dx.values()) ASSERT_FALSE(std::isnan(v)) << "attention dqkv left unwritten";

  Values gu(4 * 6);
  fill_normal(gu, 13);
  const Values poison2(gu.size(), std::nan("")), dy(4 * 3, 1.0);
  Buffer gub(DType::f64, {4, 6}, &gu), dyb(DType::f64, {4, 3}, &dy), dgu(DType::f64, {4, 6}, &poison2);
  ops::swiglu_backward(ctx, dgu.t, dyb.t, gub.t);
  for (double v : dgu.values()) ASSERT_FALSE(std::isnan(v)) << "swiglu dgate_up left unwritten";
}

// ---- cross-entropy aliasing ----------------------------------------------------------------------

// dlogits may alias logits: same bits as with a separate buffer.
TEST(CpuOps, CrossEntropyGradientMayAliasLogits) {
  Context ctx = cpu_context(2);
  const int64_t N = 7, V = 33;
  Values logits(N * V);
  fill_normal(logits, 21, 3.0);
  IntBuffer t({5, kIgnoreIndex, 0, 32, 7, 7, kIgnoreIndex}, {N});
  for (DType dt : {DType::f32, DType::f64}) {
    Buffer a(dt, {N, V}, &logits), da(dt, {N, V}), la(dt, {N});
    ops::cross_entropy(ctx, la.t, da.t, a.t, t.t, 0.25);
    Buffer b(dt, {N, V}, &logits), lb(dt, {N});
    ops::cross_entropy(ctx, lb.t, b.t, b.t, t.t, 0.25);
    EXPECT_TRUE(bit_identical(b.values(), da.values())) << dtype_name(dt);
    EXPECT_TRUE(bit_identical(lb.values(), la.values())) << dtype_name(dt);
    const Values l = la.values(), d = da.values();
    EXPECT_EQ(l[1], 0.0);
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(d[1 * V + v], 0.0) << "ignored row has a gradient";
  }
}

// ---- AdamW ---------------------------------------------------------------------------------------
//
// adamw_step against torch written out in double from the hyperparameters: the loss is a sum over
// `divisor` terms, so p.grad = grad / divisor; torch.nn.utils.clip_grad_norm_(max_norm) scales it
// by min(1, max_norm / (norm + 1e-6)); torch.optim.AdamW then decays (decayed elements only) and
// updates. The reference never reads the op's scalars tensor: it recomputes the bias corrections
// and the decay factor from lr, the betas, weight_decay and the step number.

struct AdamWSetting {
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double divisor = 1;   // grads hold the gradient of a loss sum over this many terms
  double max_norm = 0;  // clip threshold on the mean-loss gradient's norm; <= 0: none
};

using Runs = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) element ranges that decay

ops::AdamWConstants constants_of(const AdamWSetting& h) {
  ops::AdamWConstants c;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  return c;
}

// The scalars tensor the host writes before step `step` (1-based). The two slots the op writes
// start as NaN, so a missing write fails.
struct AdamWScalars {
  std::vector<double> s;
  Tensor t;
  AdamWScalars(const AdamWSetting& h, int step) : s(ops::kAdamWSlots, std::nan("")) {
    s[ops::kAdamWStepSize] = h.lr / (1 - std::pow(h.beta1, step));
    s[ops::kAdamWBiasCorrection2] = std::sqrt(1 - std::pow(h.beta2, step));
    s[ops::kAdamWDecay] = 1 - h.lr * h.weight_decay;
    s[ops::kAdamWGradDivisor] = h.divisor;
    s[ops::kAdamWMaxGradNorm] = h.max_norm;
    s[ops::kAdamWUpdate] = step;
    t = Tensor(s.data(), DType::f64, Device::cpu, {int64_t{ops::kAdamWSlots}});
  }
  AdamWScalars(const AdamWScalars&) = delete;
  AdamWScalars& operator=(const AdamWScalars&) = delete;
  double sum_squares() const { return s[ops::kAdamWSumSquares]; }
  double grad_norm() const { return s[ops::kAdamWGradNorm]; }
};

// decay_runs (R,2) i64 on the host. The storage is never empty, so R = 0 is still a present tensor.
struct DecayRuns {
  std::vector<int64_t> flat;
  Tensor t;
  explicit DecayRuns(const Runs& runs) {
    for (const auto& [b, e] : runs) {
      flat.push_back(b);
      flat.push_back(e);
    }
    flat.push_back(-1);  // padding only
    t = Tensor(flat.data(), DType::i64, Device::cpu, {static_cast<int64_t>(runs.size()), 2});
  }
  DecayRuns(const DecayRuns&) = delete;
  DecayRuns& operator=(const DecayRuns&) = delete;
};

// p, m, v after the steps, and what the last step reported.
struct AdamWState {
  Values p, m, v;
  double sum_squares = 0, grad_norm = 0;
};

// torch in double, from m = v = 0: one step per entry of grads (steps 1, 2, ...).
AdamWState adamw_reference(const Values& p0, const std::vector<Values>& grads, const Runs& runs,
                           const AdamWSetting& h) {
  const int64_t n = static_cast<int64_t>(p0.size());
  std::vector<bool> decays(static_cast<size_t>(n), false);
  for (const auto& [b, e] : runs)
    for (int64_t i = b; i < e; ++i) decays[i] = true;
  AdamWState s{p0, Values(n, 0.0), Values(n, 0.0)};
  for (size_t k = 0; k < grads.size(); ++k) {
    const int step = static_cast<int>(k) + 1;
    long double ss = 0;
    for (double g : grads[k]) ss += static_cast<long double>(g) * g;
    s.sum_squares = static_cast<double>(ss);
    s.grad_norm = std::sqrt(s.sum_squares) / h.divisor;  // norm of the mean-loss gradient
    const double clip = h.max_norm > 0 ? std::min(1.0, h.max_norm / (s.grad_norm + 1e-6)) : 1.0;
    const double bc1 = 1 - std::pow(h.beta1, step), bc2 = 1 - std::pow(h.beta2, step);
    for (int64_t i = 0; i < n; ++i) {
      const double g = grads[k][i] / h.divisor * clip;
      if (decays[i]) s.p[i] *= 1 - h.lr * h.weight_decay;
      s.m[i] = h.beta1 * s.m[i] + (1 - h.beta1) * g;
      s.v[i] = h.beta2 * s.v[i] + (1 - h.beta2) * g * g;
      s.p[i] -= (h.lr / bc1) * s.m[i] / (std::sqrt(s.v[i]) / std::sqrt(bc2) + h.eps);
    }
  }
  return s;
}

// adamw_step on host buffers of dtype dt (f32 or f64, no master), from m = v = 0.
AdamWState adamw_op(Context& ctx, DType dt, const Values& p0, const std::vector<Values>& grads,
                    const Runs& runs, const AdamWSetting& h) {
  const int64_t n = static_cast<int64_t>(p0.size());
  Buffer p(dt, {n}, &p0), m(dt, {n}), v(dt, {n});
  DecayRuns decay(runs);
  AdamWState s;
  for (size_t k = 0; k < grads.size(); ++k) {
    Buffer g(dt, {n}, &grads[k]);
    AdamWScalars scalars(h, static_cast<int>(k) + 1);
    ops::adamw_step(ctx, p.t, g.t, m.t, v.t, Tensor(), decay.t, scalars.t, constants_of(h));
    s.sum_squares = scalars.sum_squares();
    s.grad_norm = scalars.grad_norm();
  }
  s.p = p.values();
  s.m = m.values();
  s.v = v.values();
  return s;
}

// The master-weights path: params bf16 (poisoned with NaN first: they are written, never read),
// master/m/v f32, grads f32 or bf16 (the values of `grads` rounded to grad_dt).
struct AdamWMasterState {
  std::vector<float> master, m, v;
  std::vector<uint16_t> params;
  double sum_squares = 0, grad_norm = 0;
};

AdamWMasterState adamw_master_op(Context& ctx, DType grad_dt, const Values& p0,
                                 const std::vector<Values>& grads, const Runs& runs,
                                 const AdamWSetting& h) {
  const int64_t n = static_cast<int64_t>(p0.size());
  AdamWMasterState s;
  s.master.assign(p0.begin(), p0.end());
  s.m.assign(static_cast<size_t>(n), 0.f);
  s.v.assign(static_cast<size_t>(n), 0.f);
  s.params.assign(static_cast<size_t>(n), uint16_t{0x7fc0});  // bf16 NaN
  Tensor master_t(s.master.data(), DType::f32, Device::cpu, {n});
  Tensor params_t(s.params.data(), DType::bf16, Device::cpu, {n});
  Tensor m_t(s.m.data(), DType::f32, Device::cpu, {n}), v_t(s.v.data(), DType::f32, Device::cpu, {n});
  DecayRuns decay(runs);
  for (size_t k = 0; k < grads.size(); ++k) {
    std::vector<float> gf(grads[k].begin(), grads[k].end());
    std::vector<uint16_t> gb(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) gb[i] = f32_to_bf16(gf[i]);
    Tensor g_t = grad_dt == DType::bf16 ? Tensor(gb.data(), DType::bf16, Device::cpu, {n})
                                        : Tensor(gf.data(), DType::f32, Device::cpu, {n});
    AdamWScalars scalars(h, static_cast<int>(k) + 1);
    ops::adamw_step(ctx, params_t, g_t, m_t, v_t, master_t, decay.t, scalars.t, constants_of(h));
    s.sum_squares = scalars.sum_squares();
    s.grad_norm = scalars.grad_norm();
  }
  return s;
}

// The values a buffer of dtype dt holds (f32: each rounded once), so that the reference sees
// exactly the op's inputs.
Values as_stored(const Values& x, DType dt) {
  if (dt != DType::f32) return x;
  Values r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = static_cast<float>(x[i]);
  return r;
}

std::vector<Values> as_stored(const std::vector<Values>& xs, DType dt) {
  std::vector<Values> r;
  for (const Values& x : xs) r.push_back(as_stored(x, dt));
  return r;
}

Values round_bf16(const Values& x) {
  Values r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(static_cast<float>(x[i])));
  return r;
}

// p, m, v norm-wise within tol; the reported sum of squares and gradient norm within scalar_tol.
void expect_adamw_close(const AdamWState& got, const AdamWState& want, double tol,
                        const std::string& what, double scalar_tol = 1e-14) {
  EXPECT_LE(relative_error(got.p, want.p), tol) << what << ": p";
  EXPECT_LE(relative_error(got.m, want.m), tol) << what << ": m";
  EXPECT_LE(relative_error(got.v, want.v), tol) << what << ": v";
  EXPECT_NEAR(got.sum_squares, want.sum_squares, scalar_tol * want.sum_squares)
      << what << ": kAdamWSumSquares";
  EXPECT_NEAR(got.grad_norm, want.grad_norm, scalar_tol * want.grad_norm) << what << ": kAdamWGradNorm";
}

// How many elements of a float vector differ from a double vector (exact comparison; NaN differs).
int64_t mismatches(const std::vector<float>& a, const Values& b) {
  int64_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) count += !(static_cast<double>(a[i]) == b[i]);
  return count;
}

template <typename Fn>
void expect_error_naming(Fn&& fn, const std::vector<std::string>& needles, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << what << ": error does not name " << needle << ": " << e.what();
  }
}

// Two steps against the reference, f64 (1e-15) and f32 (1e-6), at 1 and 2 threads: decay over the
// whole buffer with divisor 2 and no clipping; two decay runs (the second ending mid-buffer) with
// divisor 3 and a max norm above the gradient norm (clip = 1).
TEST(CpuOps, AdamWStepMatchesTorchTwoSteps) {
  const int64_t n = 37;
  Values p0(n), g1(n), g2(n);
  fill_normal(p0, 31);
  fill_normal(g1, 32);
  fill_normal(g2, 33);
  struct Config {
    Runs runs;
    double divisor, max_norm;
  };
  const Config configs[] = {{{{0, n}}, 2.0, 0.0}, {{{4, 17}, {20, 30}}, 3.0, 100.0}};
  for (const Config& c : configs) {
    AdamWSetting h;
    h.divisor = c.divisor;
    h.max_norm = c.max_norm;
    for (int threads : {1, 2}) {
      Context ctx = cpu_context(threads);
      for (DType dt : {DType::f64, DType::f32}) {
        const std::string what = std::string(dtype_name(dt)) + " divisor " + std::to_string(c.divisor) +
                                 " threads " + std::to_string(threads);
        const AdamWState want = adamw_reference(as_stored(p0, dt), as_stored({g1, g2}, dt), c.runs, h);
        ASSERT_LT(want.grad_norm, 100.0);  // config 2 must not clip
        expect_adamw_close(adamw_op(ctx, dt, p0, {g1, g2}, c.runs, h), want,
                           dt == DType::f64 ? 1e-15 : 1e-6, what);
      }
    }
  }
}

// Master weights: the update runs on the f32 master and params (bf16, poisoned) receive its
// rounded copy. Master, m, v and the reported scalars equal the plain f32 path on the same values
// bit for bit, with f32 grads and with bf16 grads; decay runs and clipping active.
TEST(CpuOps, AdamWStepMasterWeightsMatchPlainF32) {
  const int64_t n = 37;
  Values p0(n), g1(n), g2(n);
  fill_normal(p0, 34);
  fill_normal(g1, 35);
  fill_normal(g2, 36);
  const Runs runs = {{5, 20}, {25, 37}};
  AdamWSetting h;
  h.divisor = 2;
  h.max_norm = 0.5;
  Context ctx = cpu_context(2);
  for (DType grad_dt : {DType::f32, DType::bf16}) {
    const std::string what = "grads " + std::string(dtype_name(grad_dt));
    // The gradient values as grad_dt holds them; the plain path gets the same values in f32.
    const std::vector<Values> grads = grad_dt == DType::bf16
                                          ? std::vector<Values>{round_bf16(g1), round_bf16(g2)}
                                          : std::vector<Values>{g1, g2};
    const AdamWState plain = adamw_op(ctx, DType::f32, p0, grads, runs, h);
    ASSERT_GT(plain.grad_norm, h.max_norm) << "the clip must be active";
    const AdamWMasterState got = adamw_master_op(ctx, grad_dt, p0, grads, runs, h);
    EXPECT_EQ(mismatches(got.master, plain.p), 0) << what << ": master differs from plain f32 params";
    EXPECT_EQ(mismatches(got.m, plain.m), 0) << what << ": m";
    EXPECT_EQ(mismatches(got.v, plain.v), 0) << what << ": v";
    int64_t bad_params = 0;
    for (int64_t i = 0; i < n; ++i) bad_params += got.params[i] != f32_to_bf16(got.master[i]);
    EXPECT_EQ(bad_params, 0) << what << ": params are not the rounded master";
    EXPECT_EQ(got.sum_squares, plain.sum_squares) << what;
    EXPECT_EQ(got.grad_norm, plain.grad_norm) << what;
    // And the plain path itself against torch.
    expect_adamw_close(plain, adamw_reference(as_stored(p0, DType::f32), as_stored(grads, DType::f32), runs, h),
                       1e-6, what);
  }
}

// params and grads N(0, 1), m 0.05 N(0, 1), v 0.01 N(0, 1)^2 (positive): AdamW inputs some steps
// in, from the normal streams seed, seed + 1, seed + 2 and seed + 3.
struct RandomAdamWInputs {
  Values p, g, m, v;
};
RandomAdamWInputs random_adamw_inputs(int64_t n, uint64_t seed) {
  RandomAdamWInputs in{Values(n), Values(n), Values(n), Values(n)};
  fill_normal(in.p, seed);
  fill_normal(in.g, seed + 1);
  fill_normal(in.m, seed + 2);
  fill_normal(in.v, seed + 3);
  for (double& x : in.m) x *= 0.05;
  for (double& x : in.v) x = 0.01 * x * x;
  return in;
}

// bf16 AdamW state (optimizer_state_dtype: bf16): m and v are read as f32 and the update uses
// their new values before they are stored rounded to nearest. So one step from the same state
// values gives bit for bit the f32-state step's weights, and m, v equal to its m, v rounded once.
// Step 3 from random state (every value bf16-representable), decay runs and clipping active; with
// a master copy (bf16 params) and without one (bf16 params updated directly).
TEST(CpuOps, AdamWStepBf16StateRoundsTheF32Update) {
  const int64_t n = 45;
  const auto [p0, g0, m0, v0] = random_adamw_inputs(n, 41);
  const Values p_bf = round_bf16(p0), g_bf = round_bf16(g0), m_bf = round_bf16(m0), v_bf = round_bf16(v0);
  const Runs runs = {{3, 20}, {30, 45}};
  AdamWSetting h;
  h.divisor = 2;
  h.max_norm = 0.5;
  Context ctx = cpu_context(2);
  auto bits = [](const Values& x) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(static_cast<float>(x[i]));
    return b;
  };
  for (const bool with_master : {true, false}) {
    const std::string what = with_master ? "master" : "no master";
    // f32 state from the bf16 state's values.
    std::vector<uint16_t> params_f = bits(p_bf), grads = bits(g_bf);
    std::vector<float> master_f(p_bf.begin(), p_bf.end()), m_f(m_bf.begin(), m_bf.end()), v_f(v_bf.begin(), v_bf.end());
    // bf16 state.
    std::vector<uint16_t> params_b = bits(p_bf), m_b = bits(m_bf), v_b = bits(v_bf);
    std::vector<float> master_b(p_bf.begin(), p_bf.end());
    DecayRuns decay(runs);
    AdamWScalars scalars_f(h, 3), scalars_b(h, 3);
    const Tensor g_t(grads.data(), DType::bf16, Device::cpu, {n});
    ops::adamw_step(ctx, Tensor(params_f.data(), DType::bf16, Device::cpu, {n}), g_t,
                    Tensor(m_f.data(), DType::f32, Device::cpu, {n}), Tensor(v_f.data(), DType::f32, Device::cpu, {n}),
                    with_master ? Tensor(master_f.data(), DType::f32, Device::cpu, {n}) : Tensor(), decay.t,
                    scalars_f.t, constants_of(h));
    ops::adamw_step(ctx, Tensor(params_b.data(), DType::bf16, Device::cpu, {n}), g_t,
                    Tensor(m_b.data(), DType::bf16, Device::cpu, {n}), Tensor(v_b.data(), DType::bf16, Device::cpu, {n}),
                    with_master ? Tensor(master_b.data(), DType::f32, Device::cpu, {n}) : Tensor(), decay.t,
                    scalars_b.t, constants_of(h));
    ASSERT_GT(scalars_f.grad_norm(), h.max_norm) << "the clip must be active";
    EXPECT_EQ(scalars_b.grad_norm(), scalars_f.grad_norm()) << what;
    int64_t moved = 0, bad_params = 0, bad_master = 0, bad_m = 0, bad_v = 0;
    for (int64_t i = 0; i < n; ++i) {
      moved += params_f[i] != f32_to_bf16(static_cast<float>(p_bf[i]));
      bad_params += params_b[i] != params_f[i];
      bad_master += with_master && master_b[i] != master_f[i];
      bad_m += m_b[i] != f32_to_bf16(m_f[i]);
      bad_v += v_b[i] != f32_to_bf16(v_f[i]);
    }
    EXPECT_GT(moved, n / 2) << what << ": the step must change most bf16 weights";
    EXPECT_EQ(bad_params, 0) << what << ": params differ from the f32-state step";
    EXPECT_EQ(bad_master, 0) << what << ": master differs from the f32-state step";
    EXPECT_EQ(bad_m, 0) << what << ": m is not the f32-state m rounded to bf16";
    EXPECT_EQ(bad_v, 0) << what << ": v is not the f32-state v rounded to bf16";
  }
  // m and v must share a dtype.
  std::vector<float> p(n, 0.f), g(n, 0.f), m(n, 0.f);
  std::vector<uint16_t> v(n, 0);
  DecayRuns decay(runs);
  AdamWScalars scalars(h, 1);
  expect_error_naming([&] {
    ops::adamw_step(ctx, Tensor(p.data(), DType::f32, Device::cpu, {n}), Tensor(g.data(), DType::f32, Device::cpu, {n}),
                    Tensor(m.data(), DType::f32, Device::cpu, {n}), Tensor(v.data(), DType::bf16, Device::cpu, {n}),
                    Tensor(), decay.t, scalars.t, constants_of(h));
  }, {"m and v", "got f32 and bf16"}, "m f32, v bf16");
}

// The limit of bf16 moments that docs/config.md states and the trainer warns about: a stored
// moment moves only if its change exceeds half a bf16 step (2^-9 to 2^-8 of its value). With a
// zero gradient v becomes beta2 * v: at beta2 = 0.999 every v, across binades and mantissas, rounds
// back to itself; at 0.996 and 0.99 every one shrinks.
TEST(CpuOps, AdamWStepBf16MomentCannotDecayByLessThanHalfAStep) {
  const int64_t n = 32;
  std::vector<uint16_t> v0(n);
  for (int64_t i = 0; i < n; ++i)  // mantissas 1 + j/8 in binades 2^-12 .. 2^3
    v0[i] = f32_to_bf16(std::ldexp(1.0f + static_cast<float>(i % 8) / 8.f, static_cast<int>(i / 8) * 5 - 12));
  Context ctx = cpu_context(1);
  for (const double beta2 : {0.999, 0.996, 0.99}) {
    std::vector<float> p(n, 0.5f), g(n, 0.f);
    std::vector<uint16_t> m(n, 0), v = v0;
    AdamWSetting h;
    h.beta2 = beta2;
    DecayRuns decay({});
    AdamWScalars scalars(h, 5);
    ops::adamw_step(ctx, Tensor(p.data(), DType::f32, Device::cpu, {n}), Tensor(g.data(), DType::f32, Device::cpu, {n}),
                    Tensor(m.data(), DType::bf16, Device::cpu, {n}), Tensor(v.data(), DType::bf16, Device::cpu, {n}),
                    Tensor(), decay.t, scalars.t, constants_of(h));
    int64_t unchanged = 0;
    for (int64_t i = 0; i < n; ++i) unchanged += v[i] == v0[i];
    if (beta2 > 0.998) EXPECT_EQ(unchanged, n) << "beta2 " << beta2 << ": every v should stay put";
    else EXPECT_EQ(unchanged, 0) << "beta2 " << beta2 << ": every v should shrink";
  }
}

// ---- stochastic rounding (core/stochastic_rounding.h; AdamWConstants::stochastic_rounding) -------

// Over all 2^16 draws a value rounds up exactly as many times as its 16 dropped bits say, so the
// mean of the outcomes is the value itself (exact in double: two bf16 neighbours, integer counts).
// Positive and negative values, a subnormal, a value on a bf16 point (never moves) and -0; then
// the edges: the largest finite f32 rounds to bf16's largest or to inf, inf stays inf, NaN stays a
// quiet NaN.
TEST(StochasticRounding, AllDrawsTogetherAverageToTheValue) {
  auto bits_of = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  };
  for (const float x : {1.0f + 0.3f * 0x1p-7f, -3.14159f, 0.1f, 1e-40f, 2.0f, -0.0f, 65504.7f}) {
    const uint16_t down = static_cast<uint16_t>(bits_of(x) >> 16), up = static_cast<uint16_t>(down + 1);
    double sum = 0;
    int64_t ups = 0, others = 0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const uint16_t h = bf16_bits_stochastic(bits_of(x), r);
      ups += h == up;
      others += h != up && h != down;
      sum += bf16_to_f32(h);
    }
    EXPECT_EQ(others, 0) << x << ": an outcome that is not one of the two bf16 neighbours";
    EXPECT_EQ(ups, bits_of(x) & 0xffff) << x << ": rounded up that often";
    EXPECT_EQ(sum / 65536, static_cast<double>(x)) << x << ": the mean of all draws";
  }
  const uint32_t largest = bits_of(std::numeric_limits<float>::max());
  EXPECT_EQ(bf16_bits_stochastic(largest, 0), 0x7f7f);
  EXPECT_EQ(bf16_bits_stochastic(largest, 0xffff), 0x7f80);  // inf
  EXPECT_EQ(bf16_bits_stochastic(bits_of(std::numeric_limits<float>::infinity()), 0xffff), 0x7f80);
  EXPECT_EQ(bf16_bits_stochastic(bits_of(-std::numeric_limits<float>::infinity()), 0x1234), 0xff80);
  const uint16_t nan = bf16_bits_stochastic(0x7f800001u, 0xffff);  // a NaN whose payload bf16 cannot keep
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan))) << std::hex << nan;
}

// The draws behind the rounding (rounding_bits: one splitmix64 per group of 8 elements, spread per
// element): over 2^16 elements of one stream, each 16-bit slice (params, m, v) fills 16 equal bins
// evenly (chi-square, 15 degrees of freedom, below 50: p < 1e-5 for uniform draws), and the
// correlation between neighbouring elements' slices, and between one element's slices, stays
// within 0.02 (5 standard deviations at this count); and each bit is set in half of the draws.
TEST(StochasticRounding, DrawsLookUniformAndUncorrelated) {
  constexpr int64_t n = 1 << 16;
  const uint64_t stream = rounding_stream(3, 17);
  std::vector<uint64_t> draws(n);
  for (int64_t i = 0; i < n; ++i) draws[size_t(i)] = rounding_bits(stream, uint64_t(i));
  auto slice = [&](int64_t i, int which) { return double((draws[size_t(i)] >> (16 * which)) & 0xffff) / 65535.0 - 0.5; };
  for (int which = 0; which < 3; ++which) {
    std::vector<double> bins(16, 0.0);
    for (int64_t i = 0; i < n; ++i) bins[size_t((draws[size_t(i)] >> (16 * which + 12)) & 15)] += 1;
    double chi2 = 0;
    for (double b : bins) chi2 += (b - n / 16.0) * (b - n / 16.0) / (n / 16.0);
    EXPECT_LT(chi2, 50.0) << "slice " << which;
    double neighbours = 0, within = 0;
    for (int64_t i = 0; i + 1 < n; ++i) neighbours += slice(i, which) * slice(i + 1, which);
    for (int64_t i = 0; i < n; ++i) within += slice(i, which) * slice(i, (which + 1) % 3);
    // Each product has variance 1/144 for independent uniform slices; the correlation is its sum over n/12.
    EXPECT_LT(std::fabs(neighbours / (n / 12.0)), 0.02) << "slice " << which << ", neighbouring elements";
    EXPECT_LT(std::fabs(within / (n / 12.0)), 0.02) << "slices " << which << " and " << (which + 1) % 3;
  }
  // Every one of the 48 bits, set in half of the draws to within 5 standard deviations (256 in
  // 2^16 draws, 128 each): the bins above see only each slice's top 4 bits, and a slice whose low
  // bits were stuck at 0 (a bias toward rounding down) passed them.
  for (int bit = 0; bit < 48; ++bit) {
    int64_t set = 0;
    for (int64_t i = 0; i < n; ++i) set += (draws[size_t(i)] >> bit) & 1;
    EXPECT_LT(std::llabs(2 * set - n), 2 * 5 * 128) << "bit " << bit << " set in " << set << " of " << n;
  }
}

// AdamW on bf16 weights without a master copy, at a learning rate below half a bf16 step of the
// weights (1.0, whose step below is 2^-8): rounded to nearest, every update is lost and no weight
// ever moves; rounded stochastically, the weights' mean follows the f32 run. Constant gradients
// make every update lr (to within eps), so after 50 steps the f32 weights sit at 1 - 50 lr; the
// stochastic mean over 4096 weights has a standard deviation of about 1e-4 there.
TEST(CpuOps, AdamWStepStochasticRoundingKeepsUpdatesBelowHalfABf16Step) {
  const int64_t n = 4096, steps = 50;
  AdamWSetting h;
  h.lr = 2e-4;
  h.weight_decay = 0;
  h.beta2 = 0.999;
  Context ctx = cpu_context(2);
  std::vector<float> g(n, 0.5f);
  DecayRuns decay({});
  auto run = [&](DType param_dtype, bool stochastic) {
    std::vector<float> pf(n, 1.f), m(n, 0.f), v(n, 0.f);
    std::vector<uint16_t> pb(n, f32_to_bf16(1.f));
    ops::AdamWConstants c = constants_of(h);
    c.stochastic_rounding = stochastic;
    c.rounding_seed = 7;
    for (int64_t t = 1; t <= steps; ++t) {
      AdamWScalars scalars(h, static_cast<int>(t));
      const Tensor params = param_dtype == DType::f32 ? Tensor(pf.data(), DType::f32, Device::cpu, {n})
                                                      : Tensor(pb.data(), DType::bf16, Device::cpu, {n});
      ops::adamw_step(ctx, params, Tensor(g.data(), DType::f32, Device::cpu, {n}),
                      Tensor(m.data(), DType::f32, Device::cpu, {n}), Tensor(v.data(), DType::f32, Device::cpu, {n}),
                      Tensor(), decay.t, scalars.t, c);
    }
    double mean = 0;
    for (int64_t i = 0; i < n; ++i) mean += param_dtype == DType::f32 ? pf[i] : bf16_to_f32(pb[i]);
    return mean / n;
  };
  const double f32 = run(DType::f32, false), nearest = run(DType::bf16, false), stochastic = run(DType::bf16, true);
  EXPECT_NEAR(f32, 1 - steps * h.lr, 1e-5) << "the f32 reference";
  EXPECT_EQ(nearest, 1.0) << "rounded to nearest, no update below half a bf16 step survives";
  EXPECT_NEAR(stochastic, f32, 6e-4) << "rounded stochastically, the mean follows the f32 weights";
}

// bf16 moments at beta2 = 0.999, where rounding to nearest keeps v from ever decaying (the test
// above this section): after one gradient and 400 zero ones, the f32 v has shrunk to 0.999^400 =
// 0.67 of its first value. Rounded stochastically, the mean of 4096 bf16 v follows it (to 1%);
// rounded to nearest, every v still holds its first value.
TEST(CpuOps, AdamWStepStochasticRoundingLetsBf16MomentsDecay) {
  const int64_t n = 4096, steps = 401;
  AdamWSetting h;
  h.beta2 = 0.999;
  h.weight_decay = 0;
  Context ctx = cpu_context(2);
  std::vector<float> g0(n), zero(n, 0.f);
  for (int64_t i = 0; i < n; ++i) g0[i] = 0.5f + static_cast<float>(i % 17) / 16.f;
  DecayRuns decay({});
  struct Moments {
    std::vector<double> v1, v;  // v after the first step, and at the end
  };
  auto run = [&](DType state_dtype, bool stochastic) {
    std::vector<float> p(n, 0.f), mf(n, 0.f), vf(n, 0.f);
    std::vector<uint16_t> mb(n, 0), vb(n, 0);
    ops::AdamWConstants c = constants_of(h);
    c.stochastic_rounding = stochastic;
    c.rounding_seed = 11;
    Moments out;
    auto v_values = [&] {
      std::vector<double> r(n);
      for (int64_t i = 0; i < n; ++i) r[i] = state_dtype == DType::f32 ? vf[i] : bf16_to_f32(vb[i]);
      return r;
    };
    for (int64_t t = 1; t <= steps; ++t) {
      AdamWScalars scalars(h, static_cast<int>(t));
      const bool f32 = state_dtype == DType::f32;
      ops::adamw_step(ctx, Tensor(p.data(), DType::f32, Device::cpu, {n}),
                      Tensor((t == 1 ? g0 : zero).data(), DType::f32, Device::cpu, {n}),
                      f32 ? Tensor(mf.data(), DType::f32, Device::cpu, {n}) : Tensor(mb.data(), DType::bf16, Device::cpu, {n}),
                      f32 ? Tensor(vf.data(), DType::f32, Device::cpu, {n}) : Tensor(vb.data(), DType::bf16, Device::cpu, {n}),
                      Tensor(), decay.t, scalars.t, c);
      if (t == 1) out.v1 = v_values();
    }
    out.v = v_values();
    return out;
  };
  const Moments f32 = run(DType::f32, false), nearest = run(DType::bf16, false), stochastic = run(DType::bf16, true);
  double ratio_f32 = 0, ratio_stochastic = 0;
  int64_t stuck = 0;
  for (int64_t i = 0; i < n; ++i) {
    ratio_f32 += f32.v[i] / f32.v1[i] / n;
    ratio_stochastic += stochastic.v[i] / f32.v[i] / n;
    stuck += nearest.v[i] == nearest.v1[i];
  }
  EXPECT_NEAR(ratio_f32, std::pow(0.999, steps - 1), 1e-4) << "the f32 reference decays";
  EXPECT_EQ(stuck, n) << "rounded to nearest, no bf16 v decays";
  EXPECT_NEAR(ratio_stochastic, 1.0, 0.01) << "rounded stochastically, bf16 v follows the f32 v on average";
}

// The documented draws, bit for bit: one step on bf16 params (no master), bf16 m and v gives, for
// every element i, each f32 result of the same step on f32 storage rounded by bf16_bits_stochastic
// with its own 16 bits of rounding_bits(rounding_stream(seed, t), i) (params, m, v: bits 0, 16, 32).
TEST(CpuOps, AdamWStepStochasticRoundingDrawsTheDocumentedBits) {
  const int64_t n = 777;
  const uint64_t seed = 99;
  const int t = 7;
  const auto [p0, g0, m0, v0] = random_adamw_inputs(n, 61);
  const Values p_bf = round_bf16(p0), m_bf = round_bf16(m0), v_bf = round_bf16(v0);
  AdamWSetting h;
  Context ctx = cpu_context(2);
  DecayRuns decay({{100, 600}});
  std::vector<float> g(g0.begin(), g0.end());
  // f32 storage, from the same values.
  std::vector<float> pf(p_bf.begin(), p_bf.end()), mf(m_bf.begin(), m_bf.end()), vf(v_bf.begin(), v_bf.end());
  AdamWScalars scalars_f(h, t), scalars_b(h, t);
  ops::adamw_step(ctx, Tensor(pf.data(), DType::f32, Device::cpu, {n}), Tensor(g.data(), DType::f32, Device::cpu, {n}),
                  Tensor(mf.data(), DType::f32, Device::cpu, {n}), Tensor(vf.data(), DType::f32, Device::cpu, {n}),
                  Tensor(), decay.t, scalars_f.t, constants_of(h));
  // bf16 storage, rounded stochastically.
  std::vector<uint16_t> pb(n), mb(n), vb(n);
  for (int64_t i = 0; i < n; ++i) {
    pb[i] = f32_to_bf16(static_cast<float>(p_bf[i]));
    mb[i] = f32_to_bf16(static_cast<float>(m_bf[i]));
    vb[i] = f32_to_bf16(static_cast<float>(v_bf[i]));
  }
  ops::AdamWConstants c = constants_of(h);
  c.stochastic_rounding = true;
  c.rounding_seed = seed;
  ops::adamw_step(ctx, Tensor(pb.data(), DType::bf16, Device::cpu, {n}), Tensor(g.data(), DType::f32, Device::cpu, {n}),
                  Tensor(mb.data(), DType::bf16, Device::cpu, {n}), Tensor(vb.data(), DType::bf16, Device::cpu, {n}),
                  Tensor(), decay.t, scalars_b.t, c);
  const uint64_t stream = rounding_stream(seed, t);
  auto expected = [&](float x, int64_t i, int shift) {  // the slice written out, not RoundingDraw's
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    return bf16_bits_stochastic(bits, static_cast<uint32_t>(rounding_bits(stream, uint64_t(i)) >> shift) & 0xffffu);
  };
  int64_t bad_p = 0, bad_m = 0, bad_v = 0, not_nearest = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad_p += pb[i] != expected(pf[i], i, 0);
    bad_m += mb[i] != expected(mf[i], i, 16);
    bad_v += vb[i] != expected(vf[i], i, 32);
    not_nearest += pb[i] != f32_to_bf16(pf[i]);
  }
  EXPECT_EQ(bad_p, 0) << "params";
  EXPECT_EQ(bad_m, 0) << "m";
  EXPECT_EQ(bad_v, 0) << "v";
  EXPECT_GT(not_nearest, n / 10) << "the params must not all be rounded to nearest";
}

// The draws are a function of (seed, update number, element) only: two runs agree bit for bit at
// 1 and 3 threads; another seed, or another update number, rounds differently; with a master copy
// the bf16 params stay its copy rounded to nearest (only the stores that carry the update draw).
TEST(CpuOps, AdamWStepStochasticRoundingIsAFunctionOfSeedUpdateAndElement) {
  const int64_t n = 999;
  Values p0(n), g0(n);
  fill_normal(p0, 51);
  fill_normal(g0, 52);
  AdamWSetting h;
  h.lr = 1e-3;
  DecayRuns decay({{0, 500}});
  struct Out {
    std::vector<uint16_t> p, m, v;
    std::vector<float> master;
  };
  auto run = [&](int threads, uint64_t seed, int update, bool with_master) {
    Context ctx = cpu_context(threads);
    Out o;
    for (double x : p0) o.p.push_back(f32_to_bf16(static_cast<float>(x)));
    o.m.assign(n, 0);
    o.v.assign(n, 0);
    for (uint16_t b : o.p) o.master.push_back(bf16_to_f32(b));
    std::vector<float> g(g0.begin(), g0.end());
    ops::AdamWConstants c = constants_of(h);
    c.stochastic_rounding = true;
    c.rounding_seed = seed;
    AdamWScalars scalars(h, update);
    ops::adamw_step(ctx, Tensor(o.p.data(), DType::bf16, Device::cpu, {n}), Tensor(g.data(), DType::f32, Device::cpu, {n}),
                    Tensor(o.m.data(), DType::bf16, Device::cpu, {n}), Tensor(o.v.data(), DType::bf16, Device::cpu, {n}),
                    with_master ? Tensor(o.master.data(), DType::f32, Device::cpu, {n}) : Tensor(), decay.t, scalars.t, c);
    return o;
  };
  const Out a = run(1, 5, 3, false), b = run(3, 5, 3, false), other_seed = run(1, 6, 3, false),
            other_update = run(1, 5, 4, false);
  EXPECT_TRUE(a.p == b.p && a.m == b.m && a.v == b.v) << "1 and 3 threads";
  EXPECT_NE(a.p, other_seed.p) << "another seed";
  EXPECT_NE(a.m, other_update.m) << "another update number";
  const Out with_master = run(2, 5, 3, true);
  int64_t not_nearest = 0;
  for (int64_t i = 0; i < n; ++i) not_nearest += with_master.p[i] != f32_to_bf16(with_master.master[i]);
  EXPECT_EQ(not_nearest, 0) << "with a master copy the params are its copy rounded to nearest";
  EXPECT_TRUE(with_master.m == a.m && with_master.v == a.v) << "the moments draw the same with or without master";
  // The update number is checked where stochastic rounding draws (bf16 moments here).
  Context ctx = cpu_context(1);
  std::vector<float> p(n, 0.f), g(n, 0.f);
  std::vector<uint16_t> m(n, 0), v(n, 0);
  ops::AdamWConstants c = constants_of(h);
  c.stochastic_rounding = true;
  AdamWScalars scalars(h, 1);
  scalars.s[ops::kAdamWUpdate] = 0;
  expect_error_naming([&] {
    ops::adamw_step(ctx, Tensor(p.data(), DType::f32, Device::cpu, {n}), Tensor(g.data(), DType::f32, Device::cpu, {n}),
                    Tensor(m.data(), DType::bf16, Device::cpu, {n}), Tensor(v.data(), DType::bf16, Device::cpu, {n}),
                    Tensor(), decay.t, scalars.t, c);
  }, {"update number 0", "kAdamWUpdate"}, "update number 0");
}

// With a zero gradient the step is pure decoupled weight decay, and only inside decay_runs:
// p * (1 - lr*wd) exactly inside the runs, p unchanged outside. Runs: none; one ending mid-buffer;
// two with gaps around them; the whole buffer; an empty run followed by touching runs.
TEST(CpuOps, AdamWStepDecaysOnlyInsideDecayRuns) {
  Context ctx = cpu_context(2);
  const int64_t n = 13;
  Values p0(n), zeros(n, 0.0);
  fill_normal(p0, 41);
  AdamWSetting h;
  h.lr = 3e-3;
  h.weight_decay = 0.1;
  h.max_norm = 1.0;  // a zero norm must not clip (or divide by zero)
  const double decay = 1 - h.lr * h.weight_decay;
  const Runs cases[] = {{}, {{0, 6}}, {{2, 5}, {7, 10}}, {{0, n}}, {{3, 3}, {3, 8}, {8, 13}}};
  for (const Runs& runs : cases) {
    std::vector<bool> inside(static_cast<size_t>(n), false);
    std::string what = "runs";
    for (const auto& [b, e] : runs) {
      for (int64_t i = b; i < e; ++i) inside[i] = true;
      what += " [" + std::to_string(b) + "," + std::to_string(e) + ")";
    }
    for (DType dt : {DType::f64, DType::f32}) {
      Buffer p(dt, {n}, &p0), g(dt, {n}, &zeros), m(dt, {n}), v(dt, {n});
      DecayRuns decay_runs(runs);
      AdamWScalars scalars(h, 3);
      ops::adamw_step(ctx, p.t, g.t, m.t, v.t, Tensor(), decay_runs.t, scalars.t, constants_of(h));
      const Values got = p.values();
      for (int64_t i = 0; i < n; ++i) {
        double want = p0[i];
        if (dt == DType::f64 && inside[i]) want = p0[i] * decay;
        if (dt == DType::f32)
          want = inside[i] ? static_cast<float>(p0[i]) * static_cast<float>(decay) : static_cast<float>(p0[i]);
        EXPECT_EQ(got[i], want) << what << " " << dtype_name(dt) << " element " << i
                                << (inside[i] ? " (inside)" : " (outside)");
      }
      EXPECT_EQ(m.values(), Values(n, 0.0)) << what;
      EXPECT_EQ(v.values(), Values(n, 0.0)) << what;
      EXPECT_EQ(scalars.sum_squares(), 0.0) << what;
      EXPECT_EQ(scalars.grad_norm(), 0.0) << what;
    }
  }
}

// Clipping (clip_grad_norm_ on the mean-loss gradient): with max_norm below the norm the step uses
// g * (max_norm / (norm + 1e-6)) / divisor; kAdamWGradNorm holds the unclipped sqrt(sum g^2) /
// divisor; after step 1 (m = (1-b1) g) the clipped gradient's norm is max_norm * norm/(norm+1e-6).
// With max_norm above the norm the step equals the unclipped one.
TEST(CpuOps, AdamWStepClipsToMaxNorm) {
  Context ctx = cpu_context(2);
  const int64_t n = 300;
  Values p0(n), g0(n);
  fill_normal(p0, 45);
  fill_normal(g0, 46);
  const Runs runs = {{0, 100}, {150, 290}};
  for (DType dt : {DType::f64, DType::f32}) {
    const std::string what(dtype_name(dt));
    const double tol = dt == DType::f64 ? 1e-15 : 1e-6;
    const Values g = as_stored(g0, dt), p = as_stored(p0, dt);
    AdamWSetting h;
    h.divisor = 4;
    long double ss = 0;
    for (double e : g) ss += static_cast<long double>(e) * e;
    const double norm = std::sqrt(static_cast<double>(ss)) / h.divisor;  // about 4.3
    AdamWSetting clipped = h;
    clipped.max_norm = 0.05 * norm;
    const AdamWState got = adamw_op(ctx, dt, p0, {g0}, runs, clipped);
    EXPECT_NEAR(got.grad_norm, norm, 1e-14 * norm) << what << ": kAdamWGradNorm is the unclipped norm";
    EXPECT_NEAR(got.sum_squares, static_cast<double>(ss), 1e-14 * static_cast<double>(ss)) << what;
    expect_adamw_close(got, adamw_reference(p, {g}, runs, clipped), tol, what + " clipped");
    // The formula written out: step 1's m is (1-b1) * g * (max / (norm + 1e-6)) / divisor.
    const double coef = clipped.max_norm / (norm + 1e-6) / h.divisor;
    Values m_want(n);
    for (int64_t i = 0; i < n; ++i) m_want[i] = (1 - h.beta1) * g[i] * coef;
    EXPECT_LE(relative_error(got.m, m_want), tol) << what << ": m after a clipped step";
    double m_norm = 0;
    for (double e : got.m) m_norm += e * e;
    m_norm = std::sqrt(m_norm) / (1 - h.beta1);
    EXPECT_NEAR(m_norm, clipped.max_norm * norm / (norm + 1e-6), tol * clipped.max_norm)
        << what << ": the clipped gradient's norm";
    // The clip matters: the unclipped update is far away.
    const AdamWState unclipped = adamw_reference(p, {g}, runs, h);
    EXPECT_GT(relative_error(got.m, unclipped.m), 0.5) << what;
    // A max norm above the norm clips nothing.
    AdamWSetting loose = h;
    loose.max_norm = 2 * norm;
    expect_adamw_close(adamw_op(ctx, dt, p0, {g0}, runs, loose), unclipped, tol, what + " max norm above the norm");
  }
}

// The divisor: grads of a loss summed over k terms (k * g) with divisor k step like g with divisor
// 1, with and without clipping, within rounding (k * g is rounded once more).
TEST(CpuOps, AdamWStepGradDivisorMeansLossSum) {
  Context ctx = cpu_context(2);
  const int64_t n = 300;
  const double k = 37;
  Values p0(n), g1(n), g2(n);
  fill_normal(p0, 47);
  fill_normal(g1, 48);
  fill_normal(g2, 49);
  Values kg1 = g1, kg2 = g2;
  for (auto& e : kg1) e *= k;
  for (auto& e : kg2) e *= k;
  const Runs runs = {{10, 200}};
  for (double max_norm : {0.0, 1.0}) {  // the mean gradient's norm is about 17: 1.0 clips
    AdamWSetting mean;
    mean.max_norm = max_norm;
    AdamWSetting sum = mean;
    sum.divisor = k;
    for (DType dt : {DType::f64, DType::f32}) {
      const std::string what = std::string(dtype_name(dt)) + " max_norm " + std::to_string(max_norm);
      const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
      const AdamWState a = adamw_op(ctx, dt, p0, {g1, g2}, runs, mean);
      const AdamWState b = adamw_op(ctx, dt, p0, {kg1, kg2}, runs, sum);
      EXPECT_LE(relative_error(b.p, a.p), tol) << what << ": p";
      EXPECT_LE(relative_error(b.m, a.m), tol) << what << ": m";
      EXPECT_LE(relative_error(b.v, a.v), tol) << what << ": v";
      EXPECT_NEAR(b.grad_norm, a.grad_norm, tol * a.grad_norm) << what << ": kAdamWGradNorm";
      EXPECT_NEAR(b.sum_squares, k * k * a.sum_squares, tol * k * k * a.sum_squares) << what;
      expect_adamw_close(a, adamw_reference(as_stored(p0, dt), as_stored({g1, g2}, dt), runs, mean),
                         dt == DType::f64 ? 1e-15 : 1e-6, what);
    }
  }
}

// Bit-identical results for 1, 2 and 3 threads over several sum-of-squares chunks: f64, f32 and
// the bf16-params + f32-master path, with decay runs and clipping.
TEST(CpuOps, AdamWStepThreadCountInvariant) {
  const int64_t n = 10007;
  Values p0(n), g1(n), g2(n);
  fill_normal(p0, 37);
  fill_normal(g1, 38);
  fill_normal(g2, 39);
  const Runs runs = {{0, 64}, {128, 4200}, {9000, 10000}};
  AdamWSetting h;
  h.divisor = 5;
  h.max_norm = 1.0;
  Context one = cpu_context(1);
  for (DType dt : {DType::f64, DType::f32}) {
    const AdamWState base = adamw_op(one, dt, p0, {g1, g2}, runs, h);
    for (int threads : {2, 3}) {
      Context ctx = cpu_context(threads);
      const AdamWState other = adamw_op(ctx, dt, p0, {g1, g2}, runs, h);
      const std::string what = std::string(dtype_name(dt)) + " threads " + std::to_string(threads);
      EXPECT_TRUE(bit_identical(other.p, base.p)) << what;
      EXPECT_TRUE(bit_identical(other.m, base.m)) << what;
      EXPECT_TRUE(bit_identical(other.v, base.v)) << what;
      EXPECT_EQ(other.sum_squares, base.sum_squares) << what;
      EXPECT_EQ(other.grad_norm, base.grad_norm) << what;
    }
  }
  const AdamWMasterState base = adamw_master_op(one, DType::bf16, p0, {g1, g2}, runs, h);
  for (int threads : {2, 3}) {
    Context ctx = cpu_context(threads);
    const AdamWMasterState other = adamw_master_op(ctx, DType::bf16, p0, {g1, g2}, runs, h);
    EXPECT_TRUE(other.master == base.master) << "master, threads " << threads;
    EXPECT_TRUE(other.m == base.m && other.v == base.v) << "m/v, threads " << threads;
    EXPECT_TRUE(other.params == base.params) << "params, threads " << threads;
    EXPECT_EQ(other.sum_squares, base.sum_squares) << threads;
  }
}

// Bad decay_runs are rejected with an error naming adamw_step and decay_runs: unsorted,
// overlapping, reversed, past the end, negative, wrong shape, wrong dtype, absent. A gradient
// divisor <= 0 is rejected too.
TEST(CpuOps, AdamWStepRejectsBadDecayRuns) {
  Context ctx = cpu_context(1);
  const int64_t n = 16;
  const Values p0(n, 1.0), g0(n, 0.5);
  Buffer p(DType::f32, {n}, &p0), g(DType::f32, {n}, &g0), m(DType::f32, {n}), v(DType::f32, {n});
  auto step = [&](Tensor decay_runs, const AdamWSetting& h) {
    AdamWScalars scalars(h, 1);
    ops::adamw_step(ctx, p.t, g.t, m.t, v.t, Tensor(), decay_runs, scalars.t, constants_of(h));
  };
  const AdamWSetting h;
  const Runs bad[] = {{{8, 12}, {0, 4}}, {{0, 6}, {4, 10}}, {{6, 2}}, {{0, n + 1}}, {{12, 20}}, {{-1, 4}}};
  for (const Runs& runs : bad) {
    DecayRuns d(runs);
    expect_error_naming([&] { step(d.t, h); }, {"adamw_step", "decay_runs"},
                        "runs [" + std::to_string(runs[0].first) + "," + std::to_string(runs[0].second) + ")...");
  }
  std::vector<int64_t> six = {0, 2, 4, 6, 8, 10};
  expect_error_naming([&] { step(Tensor(six.data(), DType::i64, Device::cpu, {2, 3}), h); },
                      {"adamw_step", "decay_runs"}, "shape (2,3)");
  std::vector<int32_t> narrow = {0, 4};
  expect_error_naming([&] { step(Tensor(narrow.data(), DType::i32, Device::cpu, {1, 2}), h); },
                      {"adamw_step", "decay_runs"}, "dtype i32");
  expect_error_naming([&] { step(Tensor(), h); }, {"adamw_step", "decay_runs"}, "absent");
  DecayRuns good({{0, 4}, {8, n}});
  EXPECT_NO_THROW(step(good.t, h));
  AdamWSetting zero_divisor = h;
  zero_divisor.divisor = 0;
  expect_error_naming([&] { step(good.t, zero_divisor); }, {"adamw_step", "divisor"}, "divisor 0");
}

// ---- sum_to, copy, errors ------------------------------------------------------------------------

// A host tensor of any float dtype, filled from doubles; values() is what it holds.
struct FloatBuffer {
  DType dtype;
  Values f64;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  Tensor t;
  FloatBuffer(DType dt, const Values& x) : dtype(dt) {
    const int64_t n = static_cast<int64_t>(x.size());
    void* data = nullptr;
    switch (dt) {
      case DType::f64: f64 = x; f64.push_back(0); data = f64.data(); break;
      case DType::f32: f32.assign(x.begin(), x.end()); f32.push_back(0); data = f32.data(); break;
      default:
        for (double e : x)
          half.push_back(dt == DType::bf16 ? f32_to_bf16(static_cast<float>(e)) : f32_to_f16(static_cast<float>(e)));
        half.push_back(0);
        data = half.data();
    }
    // One padding element keeps data non-null (a present tensor) when x is empty.
    t = Tensor(data, dt, Device::cpu, {n});
  }
  FloatBuffer(const FloatBuffer&) = delete;
  Values values() const {
    Values r;
    const size_t n = static_cast<size_t>(t.numel());
    for (size_t i = 0; i < n; ++i)
      r.push_back(dtype == DType::f64   ? f64[i]
                  : dtype == DType::f32 ? f32[i]
                  : dtype == DType::bf16 ? bf16_to_f32(half[i])
                                         : f16_to_f32(half[i]));
    return r;
  }
};

// sum_to against a long-double sum of the stored values (relative 1e-12), for f64, f32, bf16 and
// f16 inputs from empty to several chunks. Overwrite replaces a NaN; accumulate adds to what out
// holds (twice: twice); results are bit-identical for 1, 2 and 3 threads.
TEST(CpuOps, SumToMatchesDoubleReferenceAndAccumulates) {
  Context one = cpu_context(1), two = cpu_context(2), three = cpu_context(3);
  for (int64_t n : {100003, 4097, 4096, 1, 0}) {
    Values x(n);
    fill_normal(x, 51 + static_cast<uint64_t>(n));
    for (auto& e : x) e += 0.5;  // mean 0.5: the sum stays far from zero
    for (DType dt : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
      const std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n);
      FloatBuffer xb(dt, x);
      long double sum = 0;
      for (double e : xb.values()) sum += e;
      const double want = static_cast<double>(sum);
      double out = std::nan("");
      Tensor out_t(&out, DType::f64, Device::cpu, {1});
      ops::sum_to(one, out_t, xb.t, /*accumulate=*/false);
      EXPECT_NEAR(out, want, 1e-12 * std::fabs(want)) << what;
      const double first = out;
      for (Context* ctx : {&two, &three}) {
        out = std::nan("");
        ops::sum_to(*ctx, out_t, xb.t, false);
        EXPECT_EQ(out, first) << what << ": threads " << ctx->num_threads;
      }
      const double start = 1234.5;
      out = start;
      ops::sum_to(three, out_t, xb.t, /*accumulate=*/true);
      EXPECT_NEAR(out, start + want, 1e-12 * (start + std::fabs(want))) << what << ": accumulate";
      ops::sum_to(two, out_t, xb.t, true);
      EXPECT_NEAR(out, start + 2 * want, 1e-12 * (start + 2 * std::fabs(want))) << what << ": accumulate twice";
    }
  }
}

TEST(CpuOps, CopyConvertsBetweenDtypes) {
  Context ctx = cpu_context(2);
  const std::vector<double> src = {0.0, 1.0, -2.5, 3.140625, 1024.0, -0.0078125};  // bf16/f16-exact
  std::vector<double> f64 = src, back(src.size());
  std::vector<float> f32(src.size());
  std::vector<uint16_t> bf16(src.size()), f16(src.size());
  std::vector<int32_t> i32(src.size());
  const int64_t n = static_cast<int64_t>(src.size());
  Tensor t64(f64.data(), DType::f64, Device::cpu, {n}), tback(back.data(), DType::f64, Device::cpu, {n});
  Tensor t32(f32.data(), DType::f32, Device::cpu, {n}), tbf(bf16.data(), DType::bf16, Device::cpu, {n});
  Tensor th(f16.data(), DType::f16, Device::cpu, {n}), ti(i32.data(), DType::i32, Device::cpu, {n});
  ops::copy(ctx, t32, t64);
  ops::copy(ctx, tbf, t32);
  ops::copy(ctx, th, tbf);
  ops::copy(ctx, tback, th);
  EXPECT_EQ(back, src);
  ops::copy(ctx, ti, t64);
  EXPECT_EQ(i32, (std::vector<int32_t>{0, 1, -2, 3, 1024, 0}));  // truncation toward zero
  ops::copy(ctx, tback, ti);
  EXPECT_EQ(back, (std::vector<double>{0, 1, -2, 3, 1024, 0}));
  EXPECT_EQ(bf16_to_f32(bf16[3]), 3.140625f);
  // Round to nearest even when narrowing: 1 + 2^-8 is halfway between two bf16 values.
  std::vector<float> half_way = {1.0f + 1.0f / 256};
  std::vector<uint16_t> out(1);
  ops::copy(ctx, Tensor(out.data(), DType::bf16, Device::cpu, {1}),
            Tensor(half_way.data(), DType::f32, Device::cpu, {1}));
  EXPECT_EQ(bf16_to_f32(out[0]), 1.0f);
  // zero and add_inplace.
  Values a = {1, 2, 3}, b = {0.5, -2, 4};
  Buffer ab(DType::f64, {3}, &a), bb(DType::f64, {3}, &b);
  ops::add_inplace(ctx, ab.t, bb.t);
  EXPECT_EQ(ab.values(), (Values{1.5, 0, 7}));
  ops::zero(ctx, ab.t);
  EXPECT_EQ(ab.values(), (Values{0, 0, 0}));
}

// Errors name the op: unsupported dtypes, mismatched shapes, out-of-range ids.
TEST(CpuOps, RejectsBadArgumentsNamingTheOp) {
  Context ctx = cpu_context(1);
  auto expect_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::vector<uint16_t> h(12);
  Tensor bf(h.data(), DType::bf16, Device::cpu, {3, 4});
  expect_error([&] { ops::linear_forward(ctx, bf, bf, bf, Tensor()); }, "linear_forward");
  expect_error([&] { ops::linear_forward(ctx, bf, bf, bf, Tensor()); }, "bf16");
  Buffer x(DType::f32, {3, 4}), w(DType::f32, {5}), y(DType::f32, {3, 4}), r(DType::f32, {3});
  expect_error([&] { ops::rmsnorm_forward(ctx, y.t, r.t, x.t, w.t, 1e-6); }, "rmsnorm_forward");
  Buffer logits(DType::f32, {2, 4}), losses(DType::f32, {2});
  IntBuffer bad({1, 4}, {2});
  expect_error([&] { ops::cross_entropy(ctx, losses.t, Tensor(), logits.t, bad.t, 1.0); }, "cross_entropy");
  Buffer table(DType::f64, {3, 2}), out(DType::f64, {2, 2});
  IntBuffer ids({0, 3}, {2});
  expect_error([&] { ops::embedding_forward(ctx, out.t, ids.t, table.t); }, "embedding_forward");
  Buffer qkv(DType::f64, {1, 2, 5, 4}), o(DType::f64, {1, 2, 2, 4}), lse(DType::f64, {1, 2, 2});
  expect_error([&] { ops::attention_forward(ctx, o.t, lse.t, qkv.t, Tensor(), 2, 1, 1.0); }, "attention_forward");
}

// ---- speed (printed, never asserted) --------------------------------------------------------------

// A linear layer at the CPU demo's hidden width: N = 2048 tokens, 256 -> 768 (between the demo's qkv
// and gate/up widths). Prints GFLOP/s for the forward, din and dweight GEMMs at 1 and 2 threads.
// A benchmark, not a test (it asserts nothing): disabled, run it with
// `build/tests/ingot_tests --gtest_filter='CpuOpsPerf.*' --gtest_also_run_disabled_tests`.
TEST(CpuOpsPerf, DISABLED_LinearGflops) {
  const int64_t N = 2048, I = 256, O = 768;
  const double flops = 2.0 * N * I * O;
  for (DType dt : {DType::f32, DType::f64}) {
    Values xv(N * I), wv(O * I), gv(N * O);
    fill_normal(xv, 61);
    fill_normal(wv, 62);
    fill_normal(gv, 63);
    Buffer x(dt, {N, I}, &xv), w(dt, {O, I}, &wv), g(dt, {N, O}, &gv);
    Buffer y(dt, {N, O}), dx(dt, {N, I}), dw(dt, {O, I});
    for (int threads : {1, 2}) {
      Context ctx = cpu_context(threads);
      auto gflops = [&](auto&& fn) {
        fn();  // warm-up (scratch allocation, page faults)
        const int reps = 5;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) fn();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return flops * reps / s / 1e9;
      };
      const double fwd = gflops([&] { ops::linear_forward(ctx, y.t, x.t, w.t, Tensor()); });
      const double bwd_in = gflops([&] { ops::linear_backward(ctx, dx.t, Tensor(), Tensor(), g.t, x.t, w.t); });
      const double bwd_w = gflops([&] { ops::linear_backward(ctx, Tensor(), dw.t, Tensor(), g.t, x.t, w.t); });
      std::printf("[ perf ] linear %s N=%lld I=%lld O=%lld threads=%d: forward %.1f, din %.1f, "
                  "dweight %.1f GFLOP/s\n",
                  std::string(dtype_name(dt)).c_str(), (long long)N, (long long)I, (long long)O,
                  threads, fwd, bwd_in, bwd_w);
    }
  }
}

}  // namespace
}  // namespace ingot::test
