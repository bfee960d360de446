// Tests of the CPU backend ops, the numerical reference of the engine. One table of OpCases
// (op_harness.h) drives four checks per case; standalone tests cover accumulate semantics,
// aliasing, AdamW, sum_squares, copy conversions, argument errors and matmul speed.
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
#include <numeric>
#include <random>

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

// Backward (float64) vs central finite differences of sum(out * w), h = 1e-5.
TEST_P(CpuOpCase, BackwardMatchesFiniteDifferences) {
  const OpCase& c = op();
  if (!c.finite_differences) GTEST_SKIP() << "forward/threads-only case";
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

// Two steps against the formula of ops.h written out by hand in double; float agrees to 1e-6.
TEST(CpuOps, AdamWMatchesHandComputedTwoSteps) {
  const int64_t n = 37;
  Values p0(n), g1(n), g2(n);
  fill_normal(p0, 31);
  fill_normal(g1, 32);
  fill_normal(g2, 33);
  ops::AdamWHyper hyper;
  hyper.lr = 1e-2;
  hyper.beta1 = 0.9;
  hyper.beta2 = 0.95;
  hyper.eps = 1e-8;
  hyper.weight_decay = 0.1;
  hyper.grad_scale = 0.5;
  // Reference.
  Values p = p0, m(n, 0.0), v(n, 0.0);
  for (int step = 1; step <= 2; ++step) {
    const Values& g = step == 1 ? g1 : g2;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * hyper.grad_scale;
      p[i] *= 1 - hyper.lr * hyper.weight_decay;
      m[i] = hyper.beta1 * m[i] + (1 - hyper.beta1) * gi;
      v[i] = hyper.beta2 * v[i] + (1 - hyper.beta2) * gi * gi;
      const double bc1 = 1 - std::pow(hyper.beta1, step), bc2 = 1 - std::pow(hyper.beta2, step);
      p[i] -= (hyper.lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + hyper.eps);
    }
  }
  for (int threads : {1, 2}) {
    Context ctx = cpu_context(threads);
    for (DType dt : {DType::f64, DType::f32}) {
      Buffer pb(dt, {n}, &p0), mb(dt, {n}), vb(dt, {n}), gb1(dt, {n}, &g1), gb2(dt, {n}, &g2);
      ops::AdamWHyper h = hyper;
      h.step = 1;
      ops::adamw_update(ctx, pb.t, gb1.t, mb.t, vb.t, Tensor(), h);
      h.step = 2;
      ops::adamw_update(ctx, pb.t, gb2.t, mb.t, vb.t, Tensor(), h);
      const double tol = dt == DType::f64 ? 1e-15 : 1e-6;
      EXPECT_LE(relative_error(pb.values(), p), tol) << dtype_name(dt);
      EXPECT_LE(relative_error(mb.values(), m), tol) << dtype_name(dt);
      EXPECT_LE(relative_error(vb.values(), v), tol) << dtype_name(dt);
    }
  }
  // Master weights: the update runs on the f32 master; param (bf16) receives its rounded copy.
  Context ctx = cpu_context(2);
  std::vector<float> master(p0.begin(), p0.end()), mm(n, 0.f), vv(n, 0.f), g1f(g1.begin(), g1.end());
  std::vector<uint16_t> param(n);
  for (int64_t i = 0; i < n; ++i) param[i] = f32_to_bf16(master[i]);
  Tensor master_t(master.data(), DType::f32, Device::cpu, {n});
  Tensor param_t(param.data(), DType::bf16, Device::cpu, {n});
  Tensor m_t(mm.data(), DType::f32, Device::cpu, {n}), v_t(vv.data(), DType::f32, Device::cpu, {n});
  Tensor g_t(g1f.data(), DType::f32, Device::cpu, {n});
  Buffer plain(DType::f32, {n}, &p0), pm(DType::f32, {n}), pv(DType::f32, {n}), pg(DType::f32, {n}, &g1);
  ops::AdamWHyper h = hyper;
  ops::adamw_update(ctx, param_t, g_t, m_t, v_t, master_t, h);
  ops::adamw_update(ctx, plain.t, pg.t, pm.t, pv.t, Tensor(), h);
  const Values want = plain.values();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(static_cast<double>(master[i]), want[i]);
    EXPECT_EQ(param[i], f32_to_bf16(master[i]));
  }
}

// With a zero gradient the step is pure decoupled weight decay: p * (1 - lr*wd), exactly.
TEST(CpuOps, AdamWWeightDecayOnly) {
  Context ctx = cpu_context(2);
  const int64_t n = 10;
  Values p0(n), zeros(n, 0.0);
  fill_normal(p0, 41);
  ops::AdamWHyper h;
  h.lr = 3e-3;
  h.weight_decay = 0.1;
  h.step = 3;
  Buffer p(DType::f64, {n}, &p0), g(DType::f64, {n}, &zeros), m(DType::f64, {n}), v(DType::f64, {n});
  ops::adamw_update(ctx, p.t, g.t, m.t, v.t, Tensor(), h);
  const Values got = p.values();
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], p0[i] * (1 - h.lr * h.weight_decay));
}

// ---- sum_squares, copy, errors -------------------------------------------------------------------

TEST(CpuOps, SumSquaresIsAccurateAndThreadInvariant) {
  const int64_t n = 100003;
  Values x(n);
  fill_normal(x, 51);
  Buffer xd(DType::f64, {n}, &x), xf(DType::f32, {n}, &x);
  long double want = 0;
  for (double e : x) want += static_cast<long double>(e) * e;
  Context one = cpu_context(1), two = cpu_context(2), three = cpu_context(3);
  const double got = ops::sum_squares(one, xd.t);
  EXPECT_NEAR(got, static_cast<double>(want), 1e-12 * static_cast<double>(want));
  EXPECT_EQ(got, ops::sum_squares(two, xd.t));
  EXPECT_EQ(got, ops::sum_squares(three, xd.t));
  EXPECT_EQ(ops::sum_squares(one, xf.t), ops::sum_squares(three, xf.t));
  EXPECT_NEAR(ops::sum_squares(one, xf.t), got, 1e-6 * got);
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

// The CPU demo's linear layers: N = 8 x 256 tokens, 256 -> 768. Prints GFLOP/s for the forward,
// din and dweight GEMMs at 1 and 2 threads.
TEST(CpuOpsPerf, LinearGflops) {
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
