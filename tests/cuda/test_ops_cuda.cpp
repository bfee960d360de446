// CUDA ops against their CPU twins (ctest -L cuda, on a machine with a GPU).
//
// Every case: fresh random inputs (never zeros), rounded to bf16 so that both backends see the same
// values; the CPU twin runs in f32 on those values, the CUDA op in bf16 (f32 where the contract
// says so). CUDA outputs that an op overwrites are poisoned with NaN first, so unwritten elements
// fail; outputs that accumulate start from the same random values on both sides. The error is
// norm-wise, ||cuda - cpu|| / ||cpu|| (test_util.h); NaN never passes.
//
// Tolerances (also in docs/cuda.md):
//   | output                                                      | tolerance |
//   |-------------------------------------------------------------|-----------|
//   | bf16 outputs of every op (one bf16 rounding of an f32 value) | 1e-2      |
//   | f32 statistics from bf16 operands: rstd, lse, losses         | 1e-4      |
//   | f32 parameter grads from bf16 operands (sum order differs)   | 1e-4      |
//   | f32 outputs from f32 operands: adamw master/m/v, all-f32 adamw| 1e-5      |
//   | f64 sums of bf16/f32 values: sum_to, sum_squares_async, and  | 1e-12     |
//   |   adamw_step's sum of squares and gradient norm              |           |
//   | adamw_step with a zero gradient (pure decay, vs host f32)    | exact     |
//   | zero, copy, graph replay, determinism                        | exact     |
//
// Perf mode: INGOT_CUDA_PERF=1 ./ingot_cuda_tests --gtest_filter='CudaPerf.*' prints GB/s or
// TFLOP/s per op at LLM-sized shapes; it asserts nothing about speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "ingot/core/context.h"
#include "ingot/core/dtype.h"
#include "ingot/core/tensor.h"
#include "ingot/ops/cpu/cpu_ops.h"
#include "ingot/ops/cuda/device.h"
#include "ingot/ops/ops.h"
#include "test_util.h"

namespace ingot::test {
namespace {

constexpr double kTolBf16 = 1e-2;
constexpr double kTolStat = 1e-4;
constexpr double kTolGradF32 = 1e-4;
constexpr double kTolF32 = 1e-5;
constexpr double kTolSum = 1e-12;

using Floats = std::vector<float>;
using Dims = std::vector<int64_t>;

int64_t numel_of(const Dims& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

Tensor make_tensor(void* data, DType dtype, Device device, const Dims& dims) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) t.shape[i] = dims[i];
  return t;
}

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Normal values rounded to bf16, nonzero.
Floats randn(int64_t n, uint64_t seed, double stddev = 1.0, double mean = 0.0) {
  std::mt19937_64 rng(test_seed(seed));
  std::normal_distribution<double> dist(mean, stddev);
  Floats v(static_cast<size_t>(n));
  for (auto& x : v) {
    float f = round_bf16(static_cast<float>(dist(rng)));
    if (f == 0.f) f = 0.0078125f;
    x = f;
  }
  return v;
}

// The values times (1 + 2^-10): no longer bf16-exact, so an f32 operand read through a bf16
// conversion shows, while rounding each back to bf16 gives the value it came from (the product
// moves it by less than half a bf16 step), so bf16 copies of it are unchanged.
Floats widened(Floats v) {
  for (auto& x : v) x *= 1.0f + 1.0f / 1024;
  return v;
}

Floats abs_of(Floats v) {
  for (auto& x : v) x = std::fabs(x);
  return v;
}

std::vector<int32_t> randint(int64_t n, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937_64 rng(test_seed(seed));
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// A CPU tensor that owns its values.
template <typename T, DType D>
struct HostOwned {
  std::vector<T> v;
  Tensor t;
  HostOwned(std::vector<T> values, const Dims& dims) : v(std::move(values)) {
    t = make_tensor(v.data(), D, Device::cpu, dims);
  }
  HostOwned(const HostOwned&) = delete;
};
using HostF32 = HostOwned<float, DType::f32>;
using HostF64 = HostOwned<double, DType::f64>;
using HostI32 = HostOwned<int32_t, DType::i32>;
using HostI64 = HostOwned<int64_t, DType::i64>;

// A CPU bf16 tensor that owns its values (each rounded to nearest from the given floats).
struct HostBf16 {
  std::vector<uint16_t> v;
  Tensor t;
  HostBf16(const Floats& values, const Dims& dims) : v(values.size()) {
    for (size_t i = 0; i < values.size(); ++i) v[i] = f32_to_bf16(values[i]);
    t = make_tensor(v.data(), DType::bf16, Device::cpu, dims);
  }
  HostBf16(const HostBf16&) = delete;
};
Floats values_of(const HostF32& h) { return h.v; }
Floats values_of(const HostBf16& h) {
  Floats f(h.v.size());
  for (size_t i = 0; i < h.v.size(); ++i) f[i] = bf16_to_f32(h.v[i]);
  return f;
}

::testing::AssertionResult close(const Floats& cuda_values, const Floats& cpu_values, double tol,
                                 const std::string& what) {
  if (cuda_values.size() != cpu_values.size())
    return ::testing::AssertionFailure() << what << ": size " << cuda_values.size() << " vs "
                                         << cpu_values.size();
  const double err = relative_error(cuda_values.data(), cpu_values.data(),
                                    static_cast<int64_t>(cpu_values.size()));
  if (err <= tol) return ::testing::AssertionSuccess() << what << ": rel err " << err;
  // Name the first offending element to tell "unwritten" (NaN) from "wrong".
  size_t worst = 0;
  double worst_diff = -1;
  for (size_t i = 0; i < cpu_values.size(); ++i) {
    const double d = std::isnan(cuda_values[i]) ? std::numeric_limits<double>::infinity()
                                                : std::fabs(cuda_values[i] - cpu_values[i]);
    if (d > worst_diff) { worst_diff = d; worst = i; }
  }
  return ::testing::AssertionFailure() << what << ": rel err " << err << " > " << tol
                                       << "; worst element " << worst << ": cuda "
                                       << cuda_values[worst] << " cpu " << cpu_values[worst];
}

// Every op test: the shared fixture plus uploads of typed host vectors.
class CudaOps : public CudaFixture {
 protected:
  // Device tensor of dtype (bf16 or f32) holding `values` (converted; bf16 values are exact).
  Tensor upload(const Floats& values, DType dtype, const Dims& dims) {
    Tensor t = alloc(dtype, dims);
    EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
    write(t, values);
    return t;
  }
  Tensor upload_i32(const std::vector<int32_t>& values, const Dims& dims) {
    Tensor t = alloc(DType::i32, dims);
    cuda::copy_to_device(t.data, values.data(), t.bytes(), state_);
    return t;
  }
  Tensor upload_i64(const std::vector<int64_t>& values, const Dims& dims) {
    Tensor t = alloc(DType::i64, dims);
    EXPECT_GE(static_cast<int64_t>(values.size()), t.numel());
    cuda::copy_to_device(t.data, values.data(), t.bytes(), state_);
    return t;
  }
  Tensor upload_f64(const std::vector<double>& values, const Dims& dims) {
    Tensor t = alloc(DType::f64, dims);
    write_f64(t, values);
    return t;
  }
  void write_f64(Tensor t, const std::vector<double>& values) {
    EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
    cuda::copy_to_device(t.data, values.data(), t.bytes(), state_);
  }
  std::vector<double> download_f64(const Tensor& t) {
    std::vector<double> out(static_cast<size_t>(t.numel()));
    cuda::copy_to_host(out.data(), t.data, t.bytes(), state_);
    return out;
  }
};

// ---- memory ---------------------------------------------------------------------------------------

// n = 4096: exactly one block of the vector path (256 threads, 2 chunks of 8 each); 12296: a last
// block partly empty; 5000008: 1221 blocks, the last partly empty; 1001: the scalar path.
TEST_F(CudaOps, ZeroCopyAddInplace) {
  for (int64_t n : {4096, 12296, 5000008, 1001}) {
    const Floats x = randn(n, 1), y = randn(n, 2);
    // zero
    Tensor z = upload(x, DType::bf16, {n});
    ops::zero(gpu, z);
    const Floats zeros = download(z);
    EXPECT_TRUE(std::all_of(zeros.begin(), zeros.end(), [](float f) { return f == 0.f; }));
    // copy f32 -> bf16 rounds to nearest, ties to even: normal f32 values (16 random low bits),
    // then every 8th element an exact tie (low half 0x8000) or a value one unit either side of
    // one, on odd and even bf16 neighbours of both signs. Truncation and rounding half away from
    // zero each get some of them wrong (checked below: the data tells them apart).
    Floats wide(static_cast<size_t>(n));
    std::mt19937_64 rng(test_seed(3));
    std::normal_distribution<float> dist(0.f, 1.f);
    for (size_t i = 0; i < wide.size(); ++i) {
      wide[i] = dist(rng);
      if (i % 8 != 0) continue;
      const uint32_t low_halves[3] = {0x8000u, 0x7fffu, 0x8001u};
      const uint32_t high = (uint32_t(f32_to_bf16(wide[i])) & 0xfffeu) | uint32_t((i / 8) & 1);  // even, then odd
      const uint32_t bits = (high << 16) | low_halves[(i / 16) % 3];
      std::memcpy(&wide[i], &bits, 4);
    }
    Tensor src32 = upload(wide, DType::f32, {n});
    Tensor dst16 = poisoned(DType::bf16, {n});
    ops::copy(gpu, dst16, src32);
    Floats expect16(wide.size());
    int truncation_differs = 0, half_away_differs = 0;
    for (size_t i = 0; i < wide.size(); ++i) {
      expect16[i] = round_bf16(wide[i]);
      uint32_t bits;
      std::memcpy(&bits, &wide[i], 4);
      truncation_differs += bf16_to_f32(uint16_t(bits >> 16)) != expect16[i];
      half_away_differs += bf16_to_f32(uint16_t((bits + 0x8000u) >> 16)) != expect16[i];
    }
    ASSERT_GT(truncation_differs, 0);
    ASSERT_GT(half_away_differs, 0);
    EXPECT_EQ(download(dst16), expect16) << "copy f32->bf16 rounds to nearest even";
    Tensor dst32 = poisoned(DType::f32, {n});
    ops::copy(gpu, dst32, dst16);
    EXPECT_EQ(download(dst32), expect16) << "copy bf16->f32 is exact";
    // add_inplace: bf16 += bf16 and f32 += bf16
    HostF32 cx(x, {n}), cy(y, {n});
    ops::add_inplace(cpu, cx.t, cy.t);
    Tensor gx = upload(x, DType::bf16, {n}), gy = upload(y, DType::bf16, {n});
    ops::add_inplace(gpu, gx, gy);
    EXPECT_TRUE(close(download(gx), cx.v, kTolBf16, "add_inplace bf16"));
    const Floats x_wide = widened(x);  // the f32 accumulator is read in full
    HostF32 cx32(x_wide, {n});
    ops::add_inplace(cpu, cx32.t, cy.t);
    Tensor gx32 = upload(x_wide, DType::f32, {n});
    ops::add_inplace(gpu, gx32, gy);
    EXPECT_TRUE(close(download(gx32), cx32.v, kTolF32, "add_inplace f32 += bf16"));
  }
}

// ---- embedding --------------------------------------------------------------------------------

TEST_F(CudaOps, Embedding) {
  for (int64_t C : {64, 36}) {
    const int64_t V = 97, N = 300;  // N >> V: many repeated ids
    const Floats table = randn(V * C, 10), dout = randn(N * C, 11), dtable0 = randn(V * C, 12);
    const std::vector<int32_t> ids = randint(N, 0, int32_t(V), 13);
    HostI32 cids(ids, {N});
    HostF32 ctable(table, {V, C}), cout(Floats(N * C), {N, C});
    ops::embedding_forward(cpu, cout.t, cids.t, ctable.t);
    Tensor gids = upload_i32(ids, {N});
    Tensor gtable = upload(table, DType::bf16, {V, C});
    Tensor gout = poisoned(DType::bf16, {N, C});
    ops::embedding_forward(gpu, gout, gids, gtable);
    EXPECT_TRUE(close(download(gout), cout.v, 0.0, "embedding_forward (a gather is exact)"));

    HostF32 cdout(dout, {N, C}), cdtable(dtable0, {V, C});
    ops::embedding_backward(cpu, cdtable.t, cdout.t, cids.t);
    Tensor gdout = upload(dout, DType::bf16, {N, C});
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor gdtable = upload(dtable0, dt, {V, C});
      ops::embedding_backward(gpu, gdtable, gdout, gids);
      EXPECT_TRUE(close(download(gdtable), cdtable.v, dt == DType::f32 ? kTolGradF32 : kTolBf16,
                        "embedding_backward dtable " + std::string(dtype_name(dt))));
    }
  }
}

// Ids as padded rows give them: one id (padding, 0) for most of the batch. At N = 4100, 2560 ids
// are 0 (a run over 40 of the backward's 64-row chunks, ending exactly at a chunk's edge), 700 are 5,
// 150 are -1 and 150 are V (out of range: skipped, in runs that cross chunk edges at both ends of
// the sorted order), the rest spread; N is not a multiple of 64. N = 5, 64 and 128 (one or two
// chunks) draw from {-1, 0, 1, 2, V}. Compared with the CPU twin on the in-range tokens, and bit for
// bit with itself; with no padding id, and with 0 and 5 as padding_id (their runs, across chunks at
// N = 4100, add nothing; 0 and 2 at the small N, whose V is 3).
TEST_F(CudaOps, EmbeddingBackwardFrequentId) {
  for (const int64_t padding_choice : {0, 1, 2})
  for (const int64_t N : {4100, 5, 64, 128}) {
    const int64_t padding = padding_choice == 0 ? -1 : padding_choice == 1 ? 0 : N == 4100 ? 5 : 2;
    for (const int64_t C : {64, 36}) {
      const int64_t V = N == 4100 ? 50 : 3;
      std::vector<int32_t> ids = N == 4100 ? randint(N, 1, int32_t(V), 31) : randint(N, -1, int32_t(V) + 1, 31);
      if (N == 4100) {
        std::fill(ids.begin(), ids.begin() + 2560, 0);
        std::fill(ids.begin() + 2560, ids.begin() + 3260, 5);
        std::fill(ids.begin() + 3260, ids.begin() + 3410, -1);
        std::fill(ids.begin() + 3410, ids.begin() + 3560, int32_t(V));
        std::shuffle(ids.begin(), ids.end(), std::mt19937(34));
      }
      const Floats dout = randn(N * C, 32), dtable0 = randn(V * C, 33);
      std::vector<int32_t> kept_ids;  // the CPU twin refuses ids out of range; the CUDA op skips them
      Floats kept_dout;
      for (int64_t i = 0; i < N; ++i)
        if (ids[size_t(i)] >= 0 && ids[size_t(i)] < V) {
          kept_ids.push_back(ids[size_t(i)]);
          kept_dout.insert(kept_dout.end(), dout.begin() + i * C, dout.begin() + (i + 1) * C);
        }
      const int64_t kept = int64_t(kept_ids.size());
      HostI32 cids(kept_ids, {kept});
      HostF32 cdout(kept_dout, {kept, C}), cdtable(dtable0, {V, C});
      if (kept > 0) ops::embedding_backward(cpu, cdtable.t, cdout.t, cids.t, padding);
      Tensor gids = upload_i32(ids, {N});
      Tensor gdout = upload(dout, DType::bf16, {N, C});
      for (DType dt : {DType::f32, DType::bf16}) {
        Tensor first = upload(dtable0, dt, {V, C}), second = upload(dtable0, dt, {V, C});
        ops::embedding_backward(gpu, first, gdout, gids, padding);
        ops::embedding_backward(gpu, second, gdout, gids, padding);
        const std::string what = "embedding_backward N=" + std::to_string(N) + " C=" + std::to_string(C) + " " +
                                 std::string(dtype_name(dt)) + " padding_id " + std::to_string(padding);
        EXPECT_TRUE(close(download(first), cdtable.v, dt == DType::f32 ? kTolGradF32 : kTolBf16, what));
        EXPECT_TRUE(download_bytes(first) == download_bytes(second)) << what << ": two runs differ";
      }
    }
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------------

TEST_F(CudaOps, RmsNorm) {
  // C = 256, 896, 2048: warp-per-row path (P = 1, 4, 8), R = 4100 loops the persistent grid;
  // C = 100: scalar block path; C = 4096: vector block path; R = 2200 loops both blocks' grids.
  const std::pair<int64_t, int64_t> shapes[] = {{37, 256}, {37, 100}, {37, 4096}, {37, 896}, {4100, 2048},
                                                {2200, 100}, {2200, 4096}};
  for (const auto& [R, C] : shapes) {
    const double eps = 1e-5;
    const Floats x = randn(R * C, 20), w = randn(C, 21, 0.5, 1.0), dout = randn(R * C, 22),
                 din0 = randn(R * C, 23), dw0 = randn(C, 24);
    HostF32 cx(x, {R, C}), cw(w, {C}), cout(Floats(R * C), {R, C}), crstd(Floats(R), {R});
    ops::rmsnorm_forward(cpu, cout.t, crstd.t, cx.t, cw.t, eps);
    Tensor gx = upload(x, DType::bf16, {R, C}), gw = upload(w, DType::bf16, {C});
    Tensor gout = poisoned(DType::bf16, {R, C}), grstd = poisoned(DType::f32, {R});
    ops::rmsnorm_forward(gpu, gout, grstd, gx, gw, eps);
    EXPECT_TRUE(close(download(gout), cout.v, kTolBf16, "rmsnorm_forward out C=" + std::to_string(C)));
    EXPECT_TRUE(close(download(grstd), crstd.v, kTolStat, "rmsnorm_forward rstd"));

    // Backward on the CPU's rstd, so that both sides see identical inputs.
    HostF32 cdout(dout, {R, C}), cdin(din0, {R, C}), cdw(dw0, {C});
    ops::rmsnorm_backward(cpu, cdin.t, cdw.t, cdout.t, cx.t, cw.t, crstd.t);
    Tensor gdout = upload(dout, DType::bf16, {R, C}), grs = upload(crstd.v, DType::f32, {R});
    Tensor gdin = upload(din0, DType::bf16, {R, C}), gdw = upload(dw0, DType::f32, {C});
    ops::rmsnorm_backward(gpu, gdin, gdw, gdout, gx, gw, grs);
    EXPECT_TRUE(close(download(gdin), cdin.v, kTolBf16, "rmsnorm_backward din (accumulates)"));
    EXPECT_TRUE(close(download(gdw), cdw.v, kTolGradF32, "rmsnorm_backward dweight f32"));
    Tensor gdw16 = upload(dw0, DType::bf16, {C});
    ops::rmsnorm_backward(gpu, Tensor{}, gdw16, gdout, gx, gw, grs);
    EXPECT_TRUE(close(download(gdw16), cdw.v, kTolBf16, "rmsnorm_backward dweight bf16"));
  }
}

// ---- qk-norm ----------------------------------------------------------------------------------

TEST_F(CudaOps, QkNorm) {
  // D = 64, 128, 24: 16-byte path with 8, 16, 4 lanes per row; N = 2500 loops the persistent
  // backward grid; D = 80, 96: 16 lanes with 10 or 12 chunks (idle lanes); D = 256: 32 lanes;
  // D = 20: scalar fallback.
  const std::pair<int64_t, int64_t> shapes[] = {{19, 64}, {19, 128}, {19, 24},  {2500, 128},
                                                {19, 80}, {19, 96},  {19, 256}, {19, 20}};
  for (const auto& [N, D] : shapes) {
    const int64_t Hq = 4, Hkv = 2, Htot = Hq + 2 * Hkv, Hn = Hq + Hkv;
    const double eps = 1e-6;
    const Floats x = randn(N * Htot * D, 30), wq = randn(D, 31, 0.5, 1.0), wk = randn(D, 32, 0.5, 1.0),
                 dout = randn(N * Htot * D, 33), dwq0 = randn(D, 34), dwk0 = randn(D, 35);
    const Dims shape{N, Htot, D};
    HostF32 cx(x, shape), cwq(wq, {D}), cwk(wk, {D}), cout(Floats(x.size()), shape),
        crstd(Floats(N * Hn), {N, Hn});
    ops::qk_norm_forward(cpu, cout.t, crstd.t, cx.t, cwq.t, cwk.t, Hq, Hkv, eps);
    Tensor gx = upload(x, DType::bf16, shape), gwq = upload(wq, DType::bf16, {D}),
           gwk = upload(wk, DType::bf16, {D});
    Tensor gout = poisoned(DType::bf16, shape), grstd = poisoned(DType::f32, {N, Hn});
    ops::qk_norm_forward(gpu, gout, grstd, gx, gwq, gwk, Hq, Hkv, eps);
    EXPECT_TRUE(close(download(gout), cout.v, kTolBf16, "qk_norm_forward out D=" + std::to_string(D)));
    EXPECT_TRUE(close(download(grstd), crstd.v, kTolStat, "qk_norm_forward rstd"));

    HostF32 cdout(dout, shape), cdin(Floats(x.size()), shape), cdwq(dwq0, {D}), cdwk(dwk0, {D});
    ops::qk_norm_backward(cpu, cdin.t, cdwq.t, cdwk.t, cdout.t, cx.t, cwq.t, cwk.t, crstd.t, Hq, Hkv);
    Tensor gdout = upload(dout, DType::bf16, shape), grs = upload(crstd.v, DType::f32, {N, Hn});
    Tensor gdin = poisoned(DType::bf16, shape);
    Tensor gdwq = upload(dwq0, DType::f32, {D}), gdwk = upload(dwk0, DType::f32, {D});
    ops::qk_norm_backward(gpu, gdin, gdwq, gdwk, gdout, gx, gwq, gwk, grs, Hq, Hkv);
    EXPECT_TRUE(close(download(gdin), cdin.v, kTolBf16, "qk_norm_backward din"));
    EXPECT_TRUE(close(download(gdwq), cdwq.v, kTolGradF32, "qk_norm_backward dq_weight"));
    EXPECT_TRUE(close(download(gdwk), cdwk.v, kTolGradF32, "qk_norm_backward dk_weight"));
  }
}

// ---- linear -----------------------------------------------------------------------------------

TEST_F(CudaOps, Linear) {
  struct Case { int64_t N, I, O; bool bias; };
  for (const Case& c : {Case{70, 96, 48, true}, Case{33, 40, 24, false}, Case{256, 512, 384, true}}) {
    const std::string tag = " N=" + std::to_string(c.N) + " I=" + std::to_string(c.I) +
                            " O=" + std::to_string(c.O);
    const Floats x = randn(c.N * c.I, 40), w = randn(c.O * c.I, 41, 0.1), b = randn(c.O, 42),
                 dout = randn(c.N * c.O, 43), dw0 = randn(c.O * c.I, 44, 0.1), db0 = randn(c.O, 45);
    HostF32 cx(x, {c.N, c.I}), cw(w, {c.O, c.I}), cb(b, {c.O}), cout(Floats(c.N * c.O), {c.N, c.O});
    ops::linear_forward(cpu, cout.t, cx.t, cw.t, c.bias ? cb.t : Tensor{});
    Tensor gx = upload(x, DType::bf16, {c.N, c.I}), gw = upload(w, DType::bf16, {c.O, c.I}),
           gb = upload(b, DType::bf16, {c.O});
    Tensor gout = poisoned(DType::bf16, {c.N, c.O});
    ops::linear_forward(gpu, gout, gx, gw, c.bias ? gb : Tensor{});
    EXPECT_TRUE(close(download(gout), cout.v, kTolBf16, "linear_forward" + tag));

    HostF32 cdout(dout, {c.N, c.O}), cdin(Floats(c.N * c.I), {c.N, c.I}), cdw(dw0, {c.O, c.I}),
        cdb(db0, {c.O});
    ops::linear_backward(cpu, cdin.t, cdw.t, c.bias ? cdb.t : Tensor{}, cdout.t, cx.t, cw.t);
    Tensor gdout = upload(dout, DType::bf16, {c.N, c.O});
    Tensor gdin = poisoned(DType::bf16, {c.N, c.I});
    Tensor gdw = upload(dw0, DType::f32, {c.O, c.I}), gdb = upload(db0, DType::f32, {c.O});
    ops::linear_backward(gpu, gdin, gdw, c.bias ? gdb : Tensor{}, gdout, gx, gw);
    EXPECT_TRUE(close(download(gdin), cdin.v, kTolBf16, "linear_backward din" + tag));
    EXPECT_TRUE(close(download(gdw), cdw.v, kTolGradF32, "linear_backward dweight f32 (accumulates)" + tag));
    if (c.bias) EXPECT_TRUE(close(download(gdb), cdb.v, kTolGradF32, "linear_backward dbias f32" + tag));
    // Overwriting (a step's first micro-batch): what the buffer held (NaN) must not matter.
    HostF32 cdw_new(Floats(c.O * c.I), {c.O, c.I});
    ops::linear_backward(cpu, Tensor{}, cdw_new.t, Tensor{}, cdout.t, cx.t, cw.t, /*accumulate_dweight=*/false);
    Tensor gdw_new = poisoned(DType::f32, {c.O, c.I});
    ops::linear_backward(gpu, Tensor{}, gdw_new, Tensor{}, gdout, gx, gw, /*accumulate_dweight=*/false);
    EXPECT_TRUE(close(download(gdw_new), cdw_new.v, kTolGradF32, "linear_backward dweight f32 (overwrites)" + tag));
    // bf16 gradient buffers, accumulating too.
    Tensor gdw16 = upload(dw0, DType::bf16, {c.O, c.I}), gdb16 = upload(db0, DType::bf16, {c.O});
    ops::linear_backward(gpu, Tensor{}, gdw16, c.bias ? gdb16 : Tensor{}, gdout, gx, gw);
    EXPECT_TRUE(close(download(gdw16), cdw.v, kTolBf16, "linear_backward dweight bf16" + tag));
    if (c.bias) EXPECT_TRUE(close(download(gdb16), cdb.v, kTolBf16, "linear_backward dbias bf16" + tag));
  }
  // No rows (N = 0): an overwritten weight gradient is zero (the empty sum), an accumulated one
  // unchanged. Before the fix the overwrite threw (cuBLASLt cannot run k = 0 with beta 0).
  const Floats dw0 = randn(24 * 40, 46, 0.1);
  Tensor empty_in = upload(Floats{}, DType::bf16, {0, 40}), empty_dout = upload(Floats{}, DType::bf16, {0, 24});
  Tensor w = upload(randn(24 * 40, 47), DType::bf16, {24, 40});
  Tensor kept = upload(dw0, DType::f32, {24, 40}), overwritten = poisoned(DType::f32, {24, 40});
  ops::linear_backward(gpu, Tensor{}, kept, Tensor{}, empty_dout, empty_in, w);
  ops::linear_backward(gpu, Tensor{}, overwritten, Tensor{}, empty_dout, empty_in, w, /*accumulate_dweight=*/false);
  EXPECT_EQ(download(kept), dw0) << "linear_backward N=0 accumulating";
  EXPECT_EQ(download(overwritten), Floats(24 * 40, 0.f)) << "linear_backward N=0 overwriting";
}

// GEMMs whose output or operand holds more than 2^31 elements, as Llama-3-8B's gate/up projection
// at 8192 x 16 tokens does (131072 x 28672): cuBLASLt takes 64-bit sizes, and nothing else had
// tested one. Output (131072, 16400) = 2,149,580,800 elements; the backward reads it as dout. Rows
// past element 2^31 (n > 130944) and columns at both ends are compared with f64 references.
TEST_F(CudaOps, LinearBeyond2To31Elements) {
  const int64_t N = 131072, I = 64, O = 16400;
  ASSERT_GT(N * O, int64_t(1) << 31);
  const Floats x = randn(N * I, 60), w = randn(O * I, 61, 0.125);
  Tensor gx = upload(x, DType::bf16, {N, I}), gw = upload(w, DType::bf16, {O, I});
  Tensor gout = alloc(DType::bf16, {N, O});
  ops::linear_forward(gpu, gout, gx, gw, Tensor{});
  Tensor gdin = poisoned(DType::bf16, {N, I}), gdw = poisoned(DType::f32, {O, I});
  ops::linear_backward(gpu, gdin, gdw, Tensor{}, gout, gx, gw, /*accumulate_dweight=*/false);
  const std::vector<uint8_t> out_bytes = download_bytes(gout);
  const auto* out_bits = reinterpret_cast<const uint16_t*>(out_bytes.data());
  auto out_at = [&](int64_t n, int64_t o) { return double(bf16_to_f32(out_bits[n * O + o])); };
  const Floats din = download(gdin), dw = download(gdw);
  auto sum_of = [](int64_t count, const auto& term) {  // an f64 reference sum of term(0 .. count-1)
    double sum = 0;
    for (int64_t k = 0; k < count; ++k) sum += term(k);
    return float(sum);
  };
  for (int64_t n : {int64_t(0), int64_t(65537), int64_t(130944), int64_t(130945), N - 1}) {
    Floats got(static_cast<size_t>(O)), want(static_cast<size_t>(O));
    for (int64_t o = 0; o < O; ++o) {
      want[o] = sum_of(I, [&](int64_t i) { return double(x[n * I + i]) * double(w[o * I + i]); });
      got[o] = float(out_at(n, o));
    }
    EXPECT_TRUE(close(got, want, kTolBf16, "forward row " + std::to_string(n)));
    // din = dout W, with dout the output as the GPU stored it.
    Floats got_din(din.begin() + n * I, din.begin() + (n + 1) * I), want_din(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i)
      want_din[i] = sum_of(O, [&](int64_t o) { return out_at(n, o) * double(w[o * I + i]); });
    EXPECT_TRUE(close(got_din, want_din, kTolBf16, "backward din row " + std::to_string(n)));
  }
  for (int64_t o : {int64_t(0), int64_t(8191), O - 1}) {  // dweight = dout^T x sums over all N rows
    Floats got(dw.begin() + o * I, dw.begin() + (o + 1) * I), want(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i)
      want[i] = sum_of(N, [&](int64_t n) { return out_at(n, o) * double(x[n * I + i]); });
    EXPECT_TRUE(close(got, want, kTolGradF32, "backward dweight row " + std::to_string(o)));
  }
}

// Choosing a GEMM algorithm by timing must not change a single bit: the forward, din and the
// f32 dweight of a timed-plan context equal those of a first-choice context. Shapes large enough
// that cuBLASLt offers several candidates, including the in-place residual form. The dweight is
// overwritten (beta 0, a step's first micro-batch), then accumulated twice (beta 1, the later
// ones): a plan timed at one beta must not serve the other unchecked.
TEST_F(CudaOps, TimedGemmChoiceKeepsTheFirstChoicesBits) {
  const int64_t N = 2048, I = 1024, O = 3072;
  const Floats x = randn(N * I, 50), w = randn(O * I, 51, 0.05), res = randn(N * O, 52),
               dout = randn(N * O, 53), dw0 = randn(O * I, 54, 0.05);
  struct Result { std::vector<uint8_t> out, residual_out, din, dw; };
  auto run = [&](bool timed) {
    CudaState* state = cuda::create_state(0);
    cuda::set_gemm_tuning(state, timed);
    Context ctx;
    ctx.device = Device::cuda;
    ctx.cuda = state;
    Tensor gx = upload(x, DType::bf16, {N, I}), gw = upload(w, DType::bf16, {O, I});
    Tensor gres = upload(res, DType::bf16, {N, O}), gdout = upload(dout, DType::bf16, {N, O});
    Tensor gout = alloc(DType::bf16, {N, O}), gdin = alloc(DType::bf16, {N, I});
    Tensor gdw = upload(dw0, DType::f32, {O, I});
    ops::linear_forward(ctx, gout, gx, gw, Tensor{});
    ops::linear_forward(ctx, gres, gx, gw, Tensor{}, gres);  // residual added in place
    ops::linear_backward(ctx, gdin, gdw, Tensor{}, gdout, gx, gw, /*accumulate_dweight=*/false);
    ops::linear_backward(ctx, Tensor{}, gdw, Tensor{}, gdout, gx, gw);
    ops::linear_backward(ctx, Tensor{}, gdw, Tensor{}, gdout, gx, gw);
    cuda::synchronize(state);
    Result r{download_bytes(gout), download_bytes(gres), download_bytes(gdin), download_bytes(gdw)};
    cuda::destroy_state(state);
    return r;
  };
  const Result first = run(false), timed = run(true);
  EXPECT_TRUE(first.out == timed.out) << "linear_forward";
  EXPECT_TRUE(first.residual_out == timed.residual_out) << "linear_forward with residual in place";
  EXPECT_TRUE(first.din == timed.din) << "linear_backward din";
  EXPECT_TRUE(first.dw == timed.dw) << "linear_backward dweight (f32, overwritten, then accumulated twice)";
}

// ---- rope -------------------------------------------------------------------------------------

TEST_F(CudaOps, Rope) {
  // {Htot, rotated heads, D}: head groups of 8 that end early (6, 40 = 5 x 8, 24, 16 heads);
  // D = 80, 96: the vector path at head dims other models use; D = 20: scalar fallback (D/2 not a
  // multiple of 8). Positions below 8192 in bf16, then up to Llama 3.1's 131072 in f32: there the
  // highest frequencies' angles reach 1e5 rad, where a fast sincos is off by ~1e-3 relative, which
  // bf16's tolerance would pass and f32's (1e-5) does not.
  const int64_t shapes[][3] = {{8, 6, 64},   {8, 6, 128},  {8, 6, 20},  {48, 40, 64},
                               {32, 24, 128}, {18, 16, 64}, {8, 6, 80}, {8, 6, 96}};
  for (const int32_t max_position : {8192, 131072}) {
    for (const auto& shape_case : shapes) {
      const int64_t N = 23, Htot = shape_case[0], rotated = shape_case[1], D = shape_case[2];
      const Dims shape{N, Htot, D};
      const Floats x = randn(N * Htot * D, 50);
      const bool long_positions = max_position > 8192;
      std::vector<int32_t> pos = randint(N, 0, max_position, 51);
      if (long_positions) pos[0] = max_position - 1;  // the largest angle there is
      Floats inv_freq(D / 2);
      for (int64_t i = 0; i < D / 2; ++i)
        inv_freq[i] = static_cast<float>(1.0 / std::pow(500000.0, 2.0 * double(i) / double(D)));
      HostI32 cpos(pos, {N});
      HostF32 cf(inv_freq, {D / 2});
      Tensor gpos = upload_i32(pos, {N}), gf = upload(inv_freq, DType::f32, {D / 2});
      const DType dtype = long_positions ? DType::f32 : DType::bf16;
      for (int direction : {+1, -1}) {
        HostF32 cx(x, shape);
        Tensor gx = upload(x, dtype, shape);
        if (direction > 0) {
          ops::rope_forward(cpu, cx.t, cpos.t, cf.t, int(rotated));
          ops::rope_forward(gpu, gx, gpos, gf, int(rotated));
        } else {
          ops::rope_backward(cpu, cx.t, cpos.t, cf.t, int(rotated));
          ops::rope_backward(gpu, gx, gpos, gf, int(rotated));
        }
        EXPECT_TRUE(close(download(gx), cx.v, long_positions ? kTolF32 : kTolBf16,
                          std::string(direction > 0 ? "rope_forward" : "rope_backward") + " D=" + std::to_string(D) +
                              " positions < " + std::to_string(max_position)));
      }
    }
  }
}

// ---- attention --------------------------------------------------------------------------------

struct AttentionCase {
  int64_t B, T, Hq, Hkv, D;
  bool segments;
};

std::string attention_name(const AttentionCase& c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " Hq=" + std::to_string(c.Hq) +
         " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D) + (c.segments ? " +segments" : "");
}

TEST_F(CudaOps, Attention) {
  const AttentionCase cases[] = {
      {2, 77, 4, 2, 64, false},   // GQA, T not a multiple of the 64-row tile
      {1, 130, 4, 1, 128, false}, // D = 128, MQA-like grouping
      {2, 100, 4, 2, 64, true},   // document masking
      {1, 150, 2, 2, 128, true},
      {1, 33, 2, 1, 16, false},   // small generic head dim
      {1, 40, 3, 1, 20, true},    // head dim not a multiple of 8 (scalar loads)
      // Packed rows at head dims the tensor-core kernels do not take: the CUDA-core kernels for
      // D <= 128 with 16-byte loads; D = 100 (OpenLLaMA-3B), whole rows, which cuDNN declines.
      {1, 130, 4, 2, 80, true},
      {2, 65, 4, 4, 96, true},
      {1, 77, 4, 2, 100, false},
  };
  for (const AttentionCase& c : cases) {
    const std::string name = attention_name(c);
    const int64_t Htot = c.Hq + 2 * c.Hkv;
    const double scale = 1.0 / std::sqrt(double(c.D));
    const Dims qkv_shape{c.B, c.T, Htot, c.D}, out_shape{c.B, c.T, c.Hq, c.D}, lse_shape{c.B, c.Hq, c.T};
    const Floats qkv = randn(numel_of(qkv_shape), 60 + c.T), dout = randn(numel_of(out_shape), 61 + c.T);
    const std::vector<int32_t> seg = c.segments ? make_segments(c.B, c.T, 62) : std::vector<int32_t>{};
    HostI32 cseg(seg, {c.B, c.T});
    Tensor cseg_t = c.segments ? cseg.t : Tensor{};
    Tensor gseg = c.segments ? upload_i32(seg, {c.B, c.T}) : Tensor{};

    HostF32 cqkv(qkv, qkv_shape), cout(Floats(numel_of(out_shape)), out_shape),
        clse(Floats(numel_of(lse_shape)), lse_shape);
    ops::attention_forward(cpu, cout.t, clse.t, cqkv.t, cseg_t, int(c.Hq), int(c.Hkv), scale);
    Tensor gqkv = upload(qkv, DType::bf16, qkv_shape);
    Tensor gout = poisoned(DType::bf16, out_shape), glse = poisoned(DType::f32, lse_shape);
    ops::attention_forward(gpu, gout, glse, gqkv, gseg, int(c.Hq), int(c.Hkv), scale);
    EXPECT_TRUE(close(download(gout), cout.v, kTolBf16, "attention_forward out " + name));
    EXPECT_TRUE(close(download(glse), clse.v, kTolStat, "attention_forward lse " + name));

    // Backward from identical saved tensors: out rounded to bf16 on both sides, the CPU's lse.
    Floats out16 = cout.v;
    for (auto& f : out16) f = round_bf16(f);
    HostF32 cout16(out16, out_shape), cdout(dout, out_shape), cdqkv(Floats(qkv.size()), qkv_shape);
    ops::attention_backward(cpu, cdqkv.t, cdout.t, cout16.t, clse.t, cqkv.t, cseg_t, int(c.Hq),
                            int(c.Hkv), scale);
    Tensor gout16 = upload(out16, DType::bf16, out_shape), glse_c = upload(clse.v, DType::f32, lse_shape);
    Tensor gdout = upload(dout, DType::bf16, out_shape);
    Tensor gdqkv = poisoned(DType::bf16, qkv_shape);
    ops::attention_backward(gpu, gdqkv, gdout, gout16, glse_c, gqkv, gseg, int(c.Hq), int(c.Hkv), scale);
    const Floats got = download(gdqkv);
    EXPECT_TRUE(close(got, cdqkv.v, kTolBf16, "attention_backward dqkv " + name));
    // Per part, so that a wrong dq, dk or dv is named.
    const char* part_names[3] = {"dq", "dk", "dv"};
    const int64_t part_begin[3] = {0, c.Hq, c.Hq + c.Hkv}, part_end[3] = {c.Hq, c.Hq + c.Hkv, Htot};
    for (int p = 0; p < 3; ++p) {
      Floats a, b;
      for (int64_t bt = 0; bt < c.B * c.T; ++bt)
        for (int64_t h = part_begin[p]; h < part_end[p]; ++h)
          for (int64_t d = 0; d < c.D; ++d) {
            a.push_back(got[(bt * Htot + h) * c.D + d]);
            b.push_back(cdqkv.v[(bt * Htot + h) * c.D + d]);
          }
      EXPECT_TRUE(close(a, b, kTolBf16, std::string("attention_backward ") + part_names[p] + " " + name));
    }
  }
}

// ---- SwiGLU -----------------------------------------------------------------------------------

TEST_F(CudaOps, SwiGlu) {
  // F = 4864 (Qwen2.5-0.5B) takes more than one block across a row; N = 70000 rows pass the grid's
  // 65535 rows in y.
  for (auto [F, N] : {std::pair<int64_t, int64_t>{72, 31}, {20, 31}, {4864, 31}, {20, 70000}}) {
    const Floats gu = randn(N * 2 * F, 70, 2.0), dout = randn(N * F, 71);
    HostF32 cgu(gu, {N, 2 * F}), cout(Floats(N * F), {N, F});
    ops::swiglu_forward(cpu, cout.t, cgu.t);
    Tensor ggu = upload(gu, DType::bf16, {N, 2 * F}), gout = poisoned(DType::bf16, {N, F});
    ops::swiglu_forward(gpu, gout, ggu);
    EXPECT_TRUE(close(download(gout), cout.v, kTolBf16, "swiglu_forward F=" + std::to_string(F) + " N=" + std::to_string(N)));
    HostF32 cdout(dout, {N, F}), cdgu(Floats(N * 2 * F), {N, 2 * F});
    ops::swiglu_backward(cpu, cdgu.t, cdout.t, cgu.t);
    Tensor gdout = upload(dout, DType::bf16, {N, F}), gdgu = poisoned(DType::bf16, {N, 2 * F});
    ops::swiglu_backward(gpu, gdgu, gdout, ggu);
    EXPECT_TRUE(close(download(gdgu), cdgu.v, kTolBf16, "swiglu_backward F=" + std::to_string(F) + " N=" + std::to_string(N)));
  }
}

// ---- cross-entropy ----------------------------------------------------------------------------

// V = 515 takes the scalar path; 128256 (Llama 3) and 151936 (Qwen) are the real LM-head widths.
// bf16 and f32 logits, each against the CPU on the values the GPU holds.
TEST_F(CudaOps, CrossEntropy) {
  // N = 2200 rows: more than the grid's blocks, so blocks loop over rows.
  for (auto [V, N] : {std::pair<int64_t, int64_t>{1000, 40}, {515, 40}, {32768, 40}, {128256, 40}, {151936, 40},
                      {1000, 2200}}) {
    const double scale = 1.0 / 37.0;
    const Floats logits = randn(N * V, 80, 2.0);
    std::vector<int32_t> targets = randint(N, 0, int32_t(V), 81);
    for (int64_t n = 0; n < N; n += 7) targets[n] = ops::kIgnoreIndex;
    targets[3] = int32_t(V - 1);  // the row's last element
    targets[5] = 0;
    Tensor gt = upload_i32(targets, {N});
    HostI32 ct(targets, {N});
    for (const DType dtype : {DType::bf16, DType::f32}) {
      HostF32 cl(download(upload(logits, dtype, {N, V})), {N, V}), closs(Floats(N), {N}), cd(Floats(N * V), {N, V});
      ops::cross_entropy(cpu, closs.t, cd.t, cl.t, ct.t, scale);
      const double tol_d = dtype == DType::f32 ? kTolF32 : kTolBf16;
      const std::string tag = " V=" + std::to_string(V) + " N=" + std::to_string(N) + " " + std::string(dtype_name(dtype));
      {  // separate dlogits
        Tensor gl = upload(logits, dtype, {N, V});
        Tensor gloss = poisoned(DType::f32, {N}), gd = poisoned(dtype, {N, V});
        ops::cross_entropy(gpu, gloss, gd, gl, gt, scale);
        EXPECT_TRUE(close(download(gloss), closs.v, kTolStat, "cross_entropy losses" + tag));
        EXPECT_TRUE(close(download(gd), cd.v, tol_d, "cross_entropy dlogits" + tag));
      }
      {  // dlogits aliasing logits
        Tensor gl = upload(logits, dtype, {N, V});
        Tensor gloss = poisoned(DType::f32, {N});
        ops::cross_entropy(gpu, gloss, gl, gl, gt, scale);
        EXPECT_TRUE(close(download(gloss), closs.v, kTolStat, "cross_entropy in place losses" + tag));
        EXPECT_TRUE(close(download(gl), cd.v, tol_d, "cross_entropy in place dlogits" + tag));
      }
      {  // loss only
        Tensor gl = upload(logits, dtype, {N, V});
        Tensor gloss = poisoned(DType::f32, {N});
        ops::cross_entropy(gpu, gloss, Tensor{}, gl, gt, scale);
        EXPECT_TRUE(close(download(gloss), closs.v, kTolStat, "cross_entropy loss only" + tag));
      }
    }
  }
}

// A NaN logit makes the row's loss NaN, as on the CPU, wherever it sits. A thread whose first
// chunk was all NaN took it for an empty chunk: the loss stayed finite while dlogits were NaN.
TEST_F(CudaOps, CrossEntropyNanLogitGivesNanLoss) {
  const int64_t N = 4, V = 4096;
  Floats logits = randn(N * V, 82, 1.0);
  for (int64_t j = 0; j < 8; ++j) logits[0 * V + j] = NAN;  // row 0: thread 0's whole first 16-byte chunk
  logits[1 * V + 0] = NAN;                                   // row 1: one NaN at the start
  logits[2 * V + V - 1] = NAN;                               // row 2: one NaN at the end
  const std::vector<int32_t> targets = {100, 101, 102, 103};  // none of them NaN: the NaN must reach the sum
  for (const DType dtype : {DType::bf16, DType::f32}) {  // f32 rows: 16-byte chunks of 4
    Tensor gl = upload(logits, dtype, {N, V}), gloss = poisoned(DType::f32, {N});
    ops::cross_entropy(gpu, gloss, Tensor{}, gl, upload_i32(targets, {N}), 1.0);
    const Floats loss = download(gloss);
    for (int64_t n = 0; n < 3; ++n) EXPECT_TRUE(std::isnan(loss[n])) << "row " << n << ": " << loss[n];
    EXPECT_TRUE(std::isfinite(loss[3])) << loss[3];
  }
}

// ---- optimizer --------------------------------------------------------------------------------

using Runs = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) element ranges that decay

struct AdamWSetting {
  double lr = 1e-2, weight_decay = 0.1;
  int step = 3;
  double divisor = 2;   // grads hold the gradient of a loss sum over this many terms
  double max_norm = 0;  // <= 0: no clipping
  ops::AdamWConstants constants;  // beta1 0.9, beta2 0.999, eps 1e-8
};

// The scalars the host writes before a step; the two slots the op writes start as NaN.
std::vector<double> adamw_scalars(const AdamWSetting& h) {
  std::vector<double> s(ops::kAdamWSlots, std::numeric_limits<double>::quiet_NaN());
  s[ops::kAdamWStepSize] = h.lr / (1 - std::pow(h.constants.beta1, h.step));
  s[ops::kAdamWBiasCorrection2] = std::sqrt(1 - std::pow(h.constants.beta2, h.step));
  s[ops::kAdamWDecay] = 1 - h.lr * h.weight_decay;
  s[ops::kAdamWGradDivisor] = h.divisor;
  s[ops::kAdamWMaxGradNorm] = h.max_norm;
  s[ops::kAdamWUpdate] = h.step;
  return s;
}

// decay_runs (R,2) flattened, plus one padding pair so that R = 0 still has storage.
std::vector<int64_t> flat_runs(const Runs& runs) {
  std::vector<int64_t> flat;
  for (const auto& [b, e] : runs) {
    flat.push_back(b);
    flat.push_back(e);
  }
  flat.push_back(-1);
  flat.push_back(-1);
  return flat;
}

// The bits of a bf16 tensor's bytes, and how many of two such differ.
std::vector<uint16_t> bf16_bits(const std::vector<uint8_t>& bytes) {
  std::vector<uint16_t> bits(bytes.size() / 2);
  std::memcpy(bits.data(), bytes.data(), bytes.size());
  return bits;
}
int64_t differing(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  int64_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) count += a[i] != b[i];
  return count;
}
// Values further apart than neighbouring bf16 values (adjacent bit patterns, same sign).
int64_t differing_by_more_than_one_step(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  int64_t count = 0;
  for (size_t i = 0; i < a.size(); ++i)
    count += (a[i] >> 15) != (b[i] >> 15) || std::abs(int(a[i] & 0x7fff) - int(b[i] & 0x7fff)) > 1;
  return count;
}

// adamw_step against its CPU twin (which the CPU tests hold to torch's formula), from random m and
// v at step 3, divisor 2, with two decay runs (the second ending mid-buffer), clipping off and on.
// n = 4096 takes the vectorised kernel (run boundaries on multiples of 64, as parameters are laid
// out), n = 999 the scalar one (arbitrary boundaries). The slots the op writes start as NaN on both
// sides; with a master copy the bf16 params start as NaN (they are written, never read).
TEST_F(CudaOps, AdamW) {
  // 4500032 (vectorised, run boundaries on multiples of 64) is past the update kernel's grid, so
  // its threads loop, as they do on every model of 4.3M parameters or more.
  for (int64_t n : {4096, 4500032, 999}) {
    const Runs runs = n == 4096  ? Runs{{0, 1024}, {1536, 3008}}
                      : n == 999 ? Runs{{3, 500}, {640, 901}}
                                 : Runs{{0, 1048576}, {1536000, 4480000}};
    const int64_t R = static_cast<int64_t>(runs.size());
    HostI64 cruns(flat_runs(runs), {R, 2});
    Tensor gruns = upload_i64(cruns.v, {R, 2});
    // m, v and the master copy are f32 wherever they are f32 on the device: not bf16-exact (an f32
    // operand read through bf16 would show); p_wide and g_wide likewise for the runs without master.
    const Floats p = randn(n, 90), g = randn(n, 91), m = widened(randn(n, 92, 0.1)),
                 v = widened(abs_of(randn(n, 93, 0.1)));
    const Floats p_wide = widened(p), g_wide = widened(g);
    for (double max_norm : {0.0, 0.5}) {  // the mean gradient's norm is about sqrt(n) / 2
      AdamWSetting h;
      h.max_norm = max_norm;
      const std::vector<double> s0 = adamw_scalars(h);
      const std::string tag = " n=" + std::to_string(n) + (max_norm > 0 ? " clipped" : " unclipped");
      // The written slots against the CPU twin's; the host-written slots left as they were.
      auto check_scalars = [&](const Tensor& gs, const std::vector<double>& cpu_s, const std::string& what) {
        const std::vector<double> got = download_f64(gs);
        for (int k : {ops::kAdamWSumSquares, ops::kAdamWGradNorm})
          EXPECT_NEAR(got[k], cpu_s[k], kTolSum * std::fabs(cpu_s[k])) << what << ": slot " << k;
        for (int k = 0; k < ops::kAdamWSumSquares; ++k)
          EXPECT_EQ(got[k], s0[k]) << what << ": input slot " << k << " changed";
      };
      // bf16 params + bf16 grads + f32 master/m/v (the BF16 recipe).
      {
        HostF32 cp(p, {n}), cg(g, {n}), cm(m, {n}), cv(v, {n}), cmaster(p_wide, {n});
        HostF64 cs(s0, {ops::kAdamWSlots});
        ops::adamw_step(cpu, cp.t, cg.t, cm.t, cv.t, cmaster.t, cruns.t, cs.t, h.constants);
        if (max_norm > 0) ASSERT_GT(cs.v[ops::kAdamWGradNorm], max_norm) << "the clip must be active" << tag;
        // bf16 grads, then f32 grads with the same bf16 params (m and v checked on the first).
        for (const DType grad_dtype : {DType::bf16, DType::f32}) {
          const std::string what = grad_dtype == DType::f32 ? ", f32 grads" + tag : tag;
          Tensor gp = poisoned(DType::bf16, {n}), gg = upload(g, grad_dtype, {n});
          Tensor gm = upload(m, DType::f32, {n}), gv = upload(v, DType::f32, {n});
          Tensor gmaster = upload(p_wide, DType::f32, {n});
          Tensor gs = upload_f64(s0, {ops::kAdamWSlots});
          ops::adamw_step(gpu, gp, gg, gm, gv, gmaster, gruns, gs, h.constants);
          EXPECT_TRUE(close(download(gmaster), cmaster.v, kTolF32, "adamw master" + what));
          if (grad_dtype == DType::bf16) {
            EXPECT_TRUE(close(download(gm), cm.v, kTolF32, "adamw m" + what));
            EXPECT_TRUE(close(download(gv), cv.v, kTolF32, "adamw v" + what));
          }
          EXPECT_TRUE(close(download(gp), cp.v, kTolBf16, "adamw param bf16" + what));
          check_scalars(gs, cs.v, "adamw scalars" + what);
        }
      }
      // No master: the CUDA op against the CPU twin on the same stored values, params and grads
      // as Params holds them, m and v as State does; each output held to its dtype's tolerance.
      auto without_master = [&](auto params_tag, auto state_tag, const std::string& what) {
        using Params = typename decltype(params_tag)::type;
        using State = typename decltype(state_tag)::type;
        const DType pd = std::is_same_v<Params, HostF32> ? DType::f32 : DType::bf16;
        const DType sd = std::is_same_v<State, HostF32> ? DType::f32 : DType::bf16;
        const double param_tol = pd == DType::f32 ? kTolF32 : kTolBf16, state_tol = sd == DType::f32 ? kTolF32 : kTolBf16;
        Params cp(p_wide, {n}), cg(g_wide, {n});
        State cm(m, {n}), cv(v, {n});
        HostF64 cs(s0, {ops::kAdamWSlots});
        ops::adamw_step(cpu, cp.t, cg.t, cm.t, cv.t, Tensor{}, cruns.t, cs.t, h.constants);
        Tensor gp = upload(p_wide, pd, {n}), gg = upload(g_wide, pd, {n}), gm = upload(m, sd, {n}),
               gv = upload(v, sd, {n});
        Tensor gs = upload_f64(s0, {ops::kAdamWSlots});
        ops::adamw_step(gpu, gp, gg, gm, gv, Tensor{}, gruns, gs, h.constants);
        EXPECT_TRUE(close(download(gp), values_of(cp), param_tol, what + " param" + tag));
        EXPECT_TRUE(close(download(gm), values_of(cm), state_tol, what + " m" + tag));
        EXPECT_TRUE(close(download(gv), values_of(cv), state_tol, what + " v" + tag));
        // bf16 params and v also bit for bit, but where the two sides' f32 results differ in a last
        // bit across a rounding midpoint (about 2^-16 an element): one step moves them by less than
        // the bf16 tolerance, so a missed store or a wrong decay passed the check above. m moves by
        // about half its size in a step, which the tolerance sees; its update is a difference of
        // similar terms, and on an H200 up to 15 of 4096 values came out one bf16 step apart.
        const int64_t midpoint_allowance = std::max<int64_t>(2, n >> 12);  // 2 at n = 4096
        if constexpr (std::is_same_v<Params, HostBf16>)
          EXPECT_LE(differing(bf16_bits(download_bytes(gp)), cp.v), midpoint_allowance) << what << " param" << tag;
        if constexpr (std::is_same_v<State, HostBf16>) {
          const std::vector<uint16_t> m_bits = bf16_bits(download_bytes(gm));
          // Where beta1 * m and (1 - beta1) * g nearly cancel, the two sides' f32 results (one
          // fused multiply-add or not) differ by about 2^-24 of the terms, many bf16 steps of the
          // small result: at n = 4500032 an H200 gave 109 values more than one step apart (2.4e-5
          // an element; a result below about 2^-16 of its terms is that rare), none at n = 4096 or 999.
          EXPECT_LE(differing_by_more_than_one_step(m_bits, cm.v), n >> 14) << what << " m" << tag;
          EXPECT_LE(differing(m_bits, cm.v), n / 64) << what << " m" << tag;
          EXPECT_LE(differing(bf16_bits(download_bytes(gv)), cv.v), midpoint_allowance) << what << " v" << tag;
        }
        check_scalars(gs, cs.v, what + " scalars" + tag);
      };
      without_master(std::type_identity<HostF32>{}, std::type_identity<HostF32>{}, "adamw all-f32");
      // bf16 params updated directly (from their bf16 value, rounded once), f32 moments.
      without_master(std::type_identity<HostBf16>{}, std::type_identity<HostF32>{}, "adamw bf16 params");
      // Everything bf16: the memory of a bf16 torch model.
      without_master(std::type_identity<HostBf16>{}, std::type_identity<HostBf16>{}, "adamw all-bf16");
    }
  }
}

// Stochastic rounding (AdamWConstants::stochastic_rounding) against the CPU twin, which the CPU
// tests hold to unbiasedness: the same draws, so the same bf16 values wherever the two sides' f32
// results agree (a last-bit difference moves a value across its draw's threshold with probability
// about 2^-16: 2 elements allowed). The rounding must really be stochastic on the device: against the same step
// rounded to nearest, about a quarter of the values differ (at least a tenth asserted). bf16
// params without master with bf16 and with f32 moments; the vectorised (n = 4096) and scalar
// (n = 999) kernels; a master copy keeps its bf16 copy rounded to nearest.
TEST_F(CudaOps, AdamWStochasticRoundingMatchesCpu) {
  for (int64_t n : {4096, 999}) {
    const Runs runs = n == 4096 ? Runs{{0, 1024}, {1536, 3008}} : Runs{{3, 500}, {640, 901}};
    const int64_t R = static_cast<int64_t>(runs.size());
    HostI64 cruns(flat_runs(runs), {R, 2});
    Tensor gruns = upload_i64(cruns.v, {R, 2});
    const Floats p = randn(n, 94), g = randn(n, 95), m = randn(n, 96, 0.1), v = abs_of(randn(n, 97, 0.1));
    AdamWSetting h;
    h.constants.stochastic_rounding = true;
    h.constants.rounding_seed = 1234;
    const std::vector<double> s0 = adamw_scalars(h);
    for (const bool bf16_state : {true, false}) {
      const std::string tag = " n=" + std::to_string(n) + (bf16_state ? " all-bf16" : " bf16 params, f32 moments");
      const DType sd = bf16_state ? DType::bf16 : DType::f32;
      HostBf16 cp(p, {n}), cg(g, {n});
      HostBf16 cm_b(m, {n}), cv_b(v, {n});
      HostF32 cm_f(m, {n}), cv_f(v, {n});
      HostF64 cs(s0, {ops::kAdamWSlots});
      ops::adamw_step(cpu, cp.t, cg.t, bf16_state ? cm_b.t : cm_f.t, bf16_state ? cv_b.t : cv_f.t, Tensor{}, cruns.t,
                      cs.t, h.constants);
      std::vector<std::vector<uint16_t>> device_bits;  // params, m, v: stochastic, then to nearest
      for (const bool stochastic : {true, false}) {
        ops::AdamWConstants c = h.constants;
        c.stochastic_rounding = stochastic;
        Tensor gp = upload(p, DType::bf16, {n}), gg = upload(g, DType::bf16, {n});
        Tensor gm = upload(m, sd, {n}), gv = upload(v, sd, {n}), gs = upload_f64(s0, {ops::kAdamWSlots});
        ops::adamw_step(gpu, gp, gg, gm, gv, Tensor{}, gruns, gs, c);
        device_bits.push_back(bf16_bits(download_bytes(gp)));
        if (bf16_state) {
          device_bits.push_back(bf16_bits(download_bytes(gm)));
          device_bits.push_back(bf16_bits(download_bytes(gv)));
        } else if (stochastic) {  // f32 moments: no rounding, as on the CPU
          EXPECT_TRUE(close(download(gm), cm_f.v, kTolF32, "adamw stochastic m" + tag));
          EXPECT_TRUE(close(download(gv), cv_f.v, kTolF32, "adamw stochastic v" + tag));
        }
      }
      const size_t parts = bf16_state ? 3 : 1;
      const std::vector<uint16_t>* cpu_bits[3] = {&cp.v, &cm_b.v, &cv_b.v};
      const char* names[3] = {"params", "m", "v"};
      for (size_t k = 0; k < parts; ++k) {
        const int64_t vs_cpu = differing(device_bits[k], *cpu_bits[k]);
        const int64_t vs_nearest = differing(device_bits[k], device_bits[parts + k]);
        std::printf("    adamw stochastic %-6s%-28s bf16 values differing: from the CPU twin %lld, from nearest %lld of %lld\n",
                    names[k], tag.c_str(), static_cast<long long>(vs_cpu), static_cast<long long>(vs_nearest),
                    static_cast<long long>(n));
        EXPECT_LE(vs_cpu, 2) << names[k] << tag;
        EXPECT_GE(vs_nearest, n / 10) << names[k] << tag << ": the device rounded to nearest";
      }
    }
    // With a master copy the bf16 params are its copy rounded to nearest, stochastic or not.
    Tensor gp = poisoned(DType::bf16, {n}), gg = upload(g, DType::bf16, {n});
    Tensor gm = upload(m, DType::bf16, {n}), gv = upload(v, DType::bf16, {n}), gmaster = upload(p, DType::f32, {n});
    Tensor gs = upload_f64(s0, {ops::kAdamWSlots});
    ops::adamw_step(gpu, gp, gg, gm, gv, gmaster, gruns, gs, h.constants);
    const Floats master_after = download(gmaster);
    std::vector<uint16_t> nearest(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) nearest[size_t(i)] = f32_to_bf16(master_after[size_t(i)]);
    EXPECT_EQ(differing(bf16_bits(download_bytes(gp)), nearest), 0) << "n=" << n << ": params with a master copy";
  }
}

// With a zero gradient the step is pure decoupled weight decay: p * decay (one f32 multiply,
// exactly as on the host) inside decay_runs and p unchanged outside, with and without a master
// copy. Many runs walk the kernel's run lookup: none; every other 64-element block and one run
// ending at n (vectorised kernel); irregular runs, the last ending at n (scalar kernel).
TEST_F(CudaOps, AdamWDecaysOnlyInsideDecayRuns) {
  AdamWSetting h;
  h.lr = 3e-3;
  h.max_norm = 1.0;  // a zero norm must not clip (or divide by zero)
  const float decay = static_cast<float>(1 - h.lr * h.weight_decay);
  std::vector<std::pair<int64_t, Runs>> cases = {{4096, {}}, {4096, {{64, 4096}}}, {999, {}}};
  {
    Runs every_other;
    for (int64_t b = 0; b < 4096; b += 128) every_other.push_back({b, b + 64});
    cases.push_back({4096, every_other});
    Runs irregular;
    for (int64_t b = 5; b + 20 < 999; b += 37) irregular.push_back({b, b + 20});
    irregular.push_back({990, 999});
    cases.push_back({999, irregular});
  }
  for (const auto& [n, runs] : cases) {
    const int64_t R = static_cast<int64_t>(runs.size());
    const std::string tag = " n=" + std::to_string(n) + " runs=" + std::to_string(R);
    std::vector<bool> inside(static_cast<size_t>(n), false);
    for (const auto& [b, e] : runs)
      for (int64_t i = b; i < e; ++i) inside[i] = true;
    const Floats p = randn(n, 95 + R), zeros(static_cast<size_t>(n), 0.f);
    Floats want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[i] = inside[i] ? p[i] * decay : p[i];
    Tensor gruns = upload_i64(flat_runs(runs), {R, 2});
    auto all_zero = [](const Floats& x) { return std::all_of(x.begin(), x.end(), [](float f) { return f == 0.f; }); };
    {  // f32 params, no master
      Tensor gp = upload(p, DType::f32, {n}), gg = upload(zeros, DType::bf16, {n});
      Tensor gm = upload(zeros, DType::f32, {n}), gv = upload(zeros, DType::f32, {n});
      Tensor gs = upload_f64(adamw_scalars(h), {ops::kAdamWSlots});
      ops::adamw_step(gpu, gp, gg, gm, gv, Tensor{}, gruns, gs, h.constants);
      EXPECT_TRUE(close(download(gp), want, 0.0, "adamw pure decay, f32 params" + tag));
      EXPECT_TRUE(all_zero(download(gm)) && all_zero(download(gv))) << "m, v stay zero" << tag;
      const std::vector<double> s = download_f64(gs);
      EXPECT_EQ(s[ops::kAdamWSumSquares], 0.0) << tag;
      EXPECT_EQ(s[ops::kAdamWGradNorm], 0.0) << tag;
    }
    {  // bf16 params (poisoned) + f32 master
      Tensor gp = poisoned(DType::bf16, {n}), gmaster = upload(p, DType::f32, {n});
      Tensor gg = upload(zeros, DType::f32, {n});
      Tensor gm = upload(zeros, DType::f32, {n}), gv = upload(zeros, DType::f32, {n});
      Tensor gs = upload_f64(adamw_scalars(h), {ops::kAdamWSlots});
      ops::adamw_step(gpu, gp, gg, gm, gv, gmaster, gruns, gs, h.constants);
      EXPECT_TRUE(close(download(gmaster), want, 0.0, "adamw pure decay, master" + tag));
      Floats want16 = want;
      for (auto& f : want16) f = round_bf16(f);
      EXPECT_TRUE(close(download(gp), want16, 0.0, "adamw pure decay, bf16 params from master" + tag));
    }
  }
}

// ---- reductions -------------------------------------------------------------------------------

// sum_to against its CPU twin (relative 1e-12: both add in f64, in different orders) for f32
// inputs (not bf16-exact) and bf16 inputs: vectorised (n % 8 == 0), scalar, one element and empty.
// Overwrite replaces a NaN, accumulate adds to what out holds, and a second run gives the same bits.
TEST_F(CudaOps, SumTo) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t n : {3000000, 300001, 100003, 4096, 77, 1, 0}) {  // the first two loop over the grid
    const Floats bf = randn(n, 100 + n, 1.0, 0.5);  // mean 0.5: the sum stays far from zero
    const Floats wide = widened(bf);
    for (DType dt : {DType::f32, DType::bf16}) {
      const Floats& x = dt == DType::f32 ? wide : bf;
      const std::string tag = "sum_to " + std::string(dtype_name(dt)) + " n=" + std::to_string(n);
      double want = 0;  // the sum of nothing
      if (n > 0) {
        HostF32 cx(x, {n});
        HostF64 csum({nan}, {1});
        ops::sum_to(cpu, csum.t, cx.t, /*accumulate=*/false);
        want = csum.v[0];
      }
      Tensor gx = upload(x, dt, {n});
      Tensor out = upload_f64({nan}, {1});
      ops::sum_to(gpu, out, gx, /*accumulate=*/false);
      const double got = download_f64(out)[0];
      EXPECT_NEAR(got, want, kTolSum * std::fabs(want)) << tag;
      ops::sum_to(gpu, out, gx, false);
      EXPECT_EQ(download_f64(out)[0], got) << tag << ": a second run differs";
      const double start = 1234.5;
      write_f64(out, {start});
      ops::sum_to(gpu, out, gx, /*accumulate=*/true);
      EXPECT_NEAR(download_f64(out)[0], start + want, kTolSum * (start + std::fabs(want))) << tag << ": accumulate";
    }
  }
}

// sum_squares_async (device.h) against a host f64 sum of squares: each tensor alone, three tensors
// of mixed dtype together, and none (0).
TEST_F(CudaOps, SumSquaresAsync) {
  const int64_t sizes[3] = {100003, 4096, 77};
  long double total = 0;
  std::vector<Tensor> tensors;
  Tensor result = alloc(DType::f64, {1});
  for (int i = 0; i < 3; ++i) {
    const Floats x = randn(sizes[i], 100 + i);
    long double want = 0;
    for (float f : x) want += static_cast<long double>(f) * f;
    total += want;
    Tensor gx = upload(x, i == 1 ? DType::f32 : DType::bf16, {sizes[i]});
    tensors.push_back(gx);
    write_f64(result, {std::numeric_limits<double>::quiet_NaN()});
    cuda::sum_squares_async(gpu, &gx, 1, static_cast<double*>(result.data));
    EXPECT_NEAR(download_f64(result)[0], double(want), kTolSum * double(want)) << "sum_squares_async n=" << sizes[i];
  }
  cuda::sum_squares_async(gpu, tensors.data(), 3, static_cast<double*>(result.data));
  EXPECT_NEAR(download_f64(result)[0], double(total), kTolSum * double(total)) << "sum_squares_async over 3 tensors";
  write_f64(result, {std::numeric_limits<double>::quiet_NaN()});
  cuda::sum_squares_async(gpu, tensors.data(), 0, static_cast<double*>(result.data));
  EXPECT_EQ(download_f64(result)[0], 0.0) << "sum_squares_async over no tensors";
}

// adamw_step and sum_to read their per-step values on the device and never synchronise, so both
// can be captured once and replayed with new values: replays for steps 1 and 2 (new grads, loss
// terms, lr and bias corrections written between them) give the bits of two eager steps.
TEST_F(CudaOps, AdamWAndSumToReplayWithNewScalars) {
  const int64_t n = 12288;
  const Runs runs = {{0, 4096}, {8192, 12224}};
  const Floats p = randn(n, 180), g1 = randn(n, 181), g2 = randn(n, 182), x1 = randn(1000, 183),
               x2 = randn(1000, 184), zeros(static_cast<size_t>(n), 0.f);
  AdamWSetting h1;
  h1.step = 1;
  h1.max_norm = 1.0;
  AdamWSetting h2 = h1;
  h2.step = 2;
  h2.lr = 5e-3;
  const std::vector<double> s1 = adamw_scalars(h1), s2 = adamw_scalars(h2);
  Tensor gp = alloc(DType::bf16, {n}), gg = alloc(DType::bf16, {n}), gm = alloc(DType::f32, {n}),
         gv = alloc(DType::f32, {n}), gmaster = alloc(DType::f32, {n}), gx = alloc(DType::f32, {1000});
  Tensor gruns = upload_i64(flat_runs(runs), {2, 2}), gs = alloc(DType::f64, {ops::kAdamWSlots}),
         loss = alloc(DType::f64, {1});
  auto reset = [&] {
    poison(gp);
    write(gmaster, p);
    write(gm, zeros);
    write(gv, zeros);
  };
  auto set_step = [&](const Floats& g, const Floats& x, const std::vector<double>& s) {
    write(gg, g);
    write(gx, x);
    write_f64(gs, s);
  };
  auto step = [&] {
    ops::sum_to(gpu, loss, gx, /*accumulate=*/false);
    ops::adamw_step(gpu, gp, gg, gm, gv, gmaster, gruns, gs, h1.constants);
  };
  auto snapshot = [&] {
    std::vector<std::vector<uint8_t>> bytes;
    for (const Tensor& t : {gp, gm, gv, gmaster, gs, loss}) bytes.push_back(download_bytes(t));
    return bytes;
  };
  reset();
  set_step(g1, x1, s1);
  step();
  const auto eager1 = snapshot();
  set_step(g2, x2, s2);
  step();
  const auto eager2 = snapshot();
  EXPECT_FALSE(eager1[3] == eager2[3]) << "step 2 must move the master weights";

  reset();
  set_step(g1, x1, s1);
  capture_and_replay(step);
  const auto replay1 = snapshot();
  set_step(g2, x2, s2);
  cuda::replay(state_);
  cuda::synchronize(state_);
  const auto replay2 = snapshot();
  const char* names[] = {"params", "m", "v", "master", "scalars", "loss sum"};
  for (size_t i = 0; i < eager1.size(); ++i) {
    EXPECT_TRUE(replay1[i] == eager1[i]) << "replay of step 1 differs from eager: " << names[i];
    EXPECT_TRUE(replay2[i] == eager2[i]) << "replay of step 2 differs from eager: " << names[i];
  }
}

// ---- determinism and graphs -------------------------------------------------------------------

TEST_F(CudaOps, BackwardIsDeterministic) {
  // Twice from the same inputs and the same starting accumulators: identical bits.
  auto twice = [&](const std::string& what, const std::function<void()>& reset,
                   const std::function<void()>& run, const std::vector<Tensor>& outputs) {
    std::vector<std::vector<uint8_t>> first;
    reset();
    run();
    for (const Tensor& t : outputs) first.push_back(download_bytes(t));
    reset();
    run();
    for (size_t i = 0; i < outputs.size(); ++i)
      EXPECT_TRUE(download_bytes(outputs[i]) == first[i]) << what << ": output " << i << " differs";
  };
  {  // embedding: many repeats of few ids
    const int64_t N = 8192, V = 50, C = 256;
    const Floats dout = randn(N * C, 110), d0 = randn(V * C, 111);
    Tensor ids = upload_i32(randint(N, 0, int32_t(V), 112), {N});
    Tensor gd = upload(dout, DType::bf16, {N, C}), dt = alloc(DType::f32, {V, C});
    twice("embedding_backward", [&] { write(dt, d0); }, [&] { ops::embedding_backward(gpu, dt, gd, ids); }, {dt});
  }
  {  // rmsnorm: many rows per partial block
    const int64_t R = 4096, C = 512;
    const Floats x = randn(R * C, 120), w = randn(C, 121), dout = randn(R * C, 122),
                 rs = abs_of(randn(R, 123)), din0 = randn(R * C, 124), dw0 = randn(C, 125);
    Tensor gx = upload(x, DType::bf16, {R, C}), gw = upload(w, DType::bf16, {C}),
           gdout = upload(dout, DType::bf16, {R, C}), grs = upload(rs, DType::f32, {R});
    Tensor din = alloc(DType::bf16, {R, C}), dw = alloc(DType::f32, {C});
    twice("rmsnorm_backward", [&] { write(din, din0); write(dw, dw0); },
          [&] { ops::rmsnorm_backward(gpu, din, dw, gdout, gx, gw, grs); }, {din, dw});
  }
  {  // qk_norm
    const int64_t N = 2048, Hq = 8, Hkv = 2, D = 128, Htot = Hq + 2 * Hkv;
    const Floats x = randn(N * Htot * D, 130), dout = randn(N * Htot * D, 131), wq = randn(D, 132),
                 wk = randn(D, 133), rs = abs_of(randn(N * (Hq + Hkv), 134)), dw0 = randn(D, 135);
    Tensor gx = upload(x, DType::bf16, {N, Htot, D}), gdout = upload(dout, DType::bf16, {N, Htot, D});
    Tensor gwq = upload(wq, DType::bf16, {D}), gwk = upload(wk, DType::bf16, {D}),
           grs = upload(rs, DType::f32, {N, Hq + Hkv});
    Tensor din = alloc(DType::bf16, {N, Htot, D}), dwq = alloc(DType::f32, {D}), dwk = alloc(DType::f32, {D});
    twice("qk_norm_backward", [&] { write(dwq, dw0); write(dwk, dw0); },
          [&] { ops::qk_norm_backward(gpu, din, dwq, dwk, gdout, gx, gwq, gwk, grs, Hq, Hkv); },
          {din, dwq, dwk});
  }
  {  // linear
    const int64_t N = 1024, I = 512, O = 768;
    const Floats x = randn(N * I, 140), w = randn(O * I, 141, 0.05), dout = randn(N * O, 142),
                 dw0 = randn(O * I, 143), db0 = randn(O, 144);
    Tensor gx = upload(x, DType::bf16, {N, I}), gw = upload(w, DType::bf16, {O, I}),
           gdout = upload(dout, DType::bf16, {N, O});
    Tensor din = alloc(DType::bf16, {N, I}), dw = alloc(DType::f32, {O, I}), db = alloc(DType::f32, {O});
    twice("linear_backward", [&] { write(dw, dw0); write(db, db0); },
          [&] { ops::linear_backward(gpu, din, dw, db, gdout, gx, gw); }, {din, dw, db});
  }
  {  // attention with segments
    const int64_t B = 2, T = 300, Hq = 4, Hkv = 2, D = 64, Htot = Hq + 2 * Hkv;
    const double scale = 0.125;
    Tensor qkv = upload(randn(B * T * Htot * D, 150), DType::bf16, {B, T, Htot, D});
    Tensor seg = upload_i32(make_segments(B, T, 151), {B, T});
    Tensor out = alloc(DType::bf16, {B, T, Hq, D}), lse = alloc(DType::f32, {B, Hq, T});
    ops::attention_forward(gpu, out, lse, qkv, seg, int(Hq), int(Hkv), scale);
    Tensor dout = upload(randn(B * T * Hq * D, 152), DType::bf16, {B, T, Hq, D});
    Tensor dqkv = alloc(DType::bf16, {B, T, Htot, D});
    twice("attention_backward", [&] { poison(dqkv); },
          [&] { ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, seg, int(Hq), int(Hkv), scale); },
          {dqkv});
  }
  for (int64_t V : {4096, 151936}) {  // cross-entropy dlogits
    const int64_t N = 64;
    const Floats logits = randn(N * V, 160);
    Tensor gl = upload(logits, DType::bf16, {N, V}), gt = upload_i32(randint(N, 0, int32_t(V), 161), {N});
    Tensor loss = alloc(DType::f32, {N}), d = alloc(DType::bf16, {N, V});
    twice("cross_entropy V=" + std::to_string(V), [] {}, [&] { ops::cross_entropy(gpu, loss, d, gl, gt, 0.5); },
          {loss, d});
  }
}

TEST_F(CudaOps, GraphReplayMatchesEager) {
  const int64_t N = 256, C = 512, O = 1024;
  const Floats x = randn(N * C, 170), w = randn(C, 171, 0.5, 1.0), lw = randn(O * C, 172, 0.05);
  Tensor gx = upload(x, DType::bf16, {N, C}), gw = upload(w, DType::bf16, {C}),
         glw = upload(lw, DType::bf16, {O, C});
  Tensor normed = alloc(DType::bf16, {N, C}), rstd = alloc(DType::f32, {N}), out = alloc(DType::bf16, {N, O});
  // rmsnorm + linear, eager then captured and replayed (twice).
  auto forward = [&] {
    ops::rmsnorm_forward(gpu, normed, rstd, gx, gw, 1e-5);
    ops::linear_forward(gpu, out, normed, glw, Tensor{});
  };
  forward();
  const std::vector<uint8_t> eager = download_bytes(out);
  poison(out);
  cuda::begin_capture(state_);
  forward();
  cuda::end_capture_and_instantiate(state_);
  for (int i = 0; i < 2; ++i) {
    poison(out);
    cuda::replay(state_);
    cuda::synchronize(state_);
    EXPECT_TRUE(download_bytes(out) == eager) << "replay " << i << " differs from the eager run";
  }
}

// ---- perf mode --------------------------------------------------------------------------------

class CudaPerf : public CudaOps {
 protected:
  void SetUp() override {
    if (!perf_mode()) GTEST_SKIP() << "set INGOT_CUDA_PERF=1 to run perf mode";
    CudaOps::SetUp();
  }
  // Large random device tensor: a 1M-element random block repeated at shifting offsets (host
  // generation of billions of normals would dominate the run).
  Tensor random_device(DType dtype, const Dims& dims, uint64_t seed, double stddev = 1.0,
                       bool positive = false) {
    Tensor t = alloc(dtype, dims);
    const int64_t n = t.numel(), block = int64_t(1) << 20;
    Floats values = randn(block + 4096, seed, stddev);
    if (positive) values = abs_of(values);
    const int64_t elem = dtype_size(dtype);
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
    for (int64_t at = 0, k = 0; at < n; at += block, ++k) {
      const int64_t count = std::min(block, n - at), shift = (k * 977) % 4096;
      const void* src = dtype == DType::f32 ? static_cast<const void*>(values.data() + shift)
                                            : static_cast<const void*>(bits.data() + shift);
      cuda::copy_to_device(static_cast<char*>(t.data) + at * elem, src, count * elem, state_);
    }
    return t;
  }
  double time_ms(const std::function<void()>& fn, int warmup = 3, int iters = 10) {
    return median_ms(state_, fn, warmup, iters);
  }
  void report_bytes(const std::string& name, double bytes, double ms) {
    std::printf("  %-34s %9.3f ms  %8.1f GB/s\n", name.c_str(), ms, bytes / (ms * 1e-3) / 1e9);
  }
  void report_flops(const std::string& name, double flops, double ms) {
    std::printf("  %-34s %9.3f ms  %8.1f TFLOP/s\n", name.c_str(), ms, flops / (ms * 1e-3) / 1e12);
  }
};

TEST_F(CudaPerf, LlmShapes) {
  const int64_t N = 16384, C = 2048, F = 8192, Hq = 16, Hkv = 8, D = 128, B = 4, T = N / B;
  const int64_t Htot = Hq + 2 * Hkv, V = 32768;
  std::printf("Ingot CUDA op perf on %s: N=%ld C=%ld F=%ld Hq=%ld Hkv=%ld D=%ld T=%ld V=%ld\n",
              cuda::device_name().c_str(), long(N), long(C), long(F), long(Hq), long(Hkv), long(D),
              long(T), long(V));
  const double e = 2.0;  // bytes per bf16
  Tensor x = upload(randn(N * C, 1), DType::bf16, {N, C}), y = upload(randn(N * C, 2), DType::bf16, {N, C});
  Tensor w = upload(randn(C, 3, 0.5, 1.0), DType::bf16, {C});
  Tensor out = alloc(DType::bf16, {N, C}), rstd = alloc(DType::f32, {N}), dw = alloc(DType::f32, {C});
  report_bytes("add_inplace bf16", 3 * e * N * C, time_ms([&] { ops::add_inplace(gpu, x, y); }));
  Tensor x32 = alloc(DType::f32, {N, C});
  report_bytes("copy bf16->f32", 6.0 * N * C, time_ms([&] { ops::copy(gpu, x32, x); }));
  report_bytes("rmsnorm_forward", 2 * e * N * C, time_ms([&] { ops::rmsnorm_forward(gpu, out, rstd, x, w, 1e-5); }));
  report_bytes("rmsnorm_backward", 4 * e * N * C, time_ms([&] { ops::rmsnorm_backward(gpu, out, dw, y, x, w, rstd); }));
  {
    const int64_t Vt = 128256;
    Tensor table = random_device(DType::bf16, {Vt, C}, 4);
    Tensor ids = upload_i32(randint(N, 0, int32_t(Vt), 5), {N});
    Tensor dtable = alloc(DType::f32, {Vt, C});
    report_bytes("embedding_forward", 2 * e * N * C, time_ms([&] { ops::embedding_forward(gpu, out, ids, table); }));
    report_bytes("embedding_backward (f32 dtable)", (e + 8.0) * N * C,
                 time_ms([&] { ops::embedding_backward(gpu, dtable, y, ids); }));
  }
  {
    Tensor gu = upload(randn(N * 2 * F, 6), DType::bf16, {N, 2 * F});
    Tensor s = alloc(DType::bf16, {N, F}), dgu = alloc(DType::bf16, {N, 2 * F});
    Tensor ds = upload(randn(N * F, 7), DType::bf16, {N, F});
    report_bytes("swiglu_forward", 3 * e * N * F, time_ms([&] { ops::swiglu_forward(gpu, s, gu); }));
    report_bytes("swiglu_backward", 5 * e * N * F, time_ms([&] { ops::swiglu_backward(gpu, dgu, ds, gu); }));
  }
  {
    Tensor wl = upload(randn(F * C, 8, 0.02), DType::bf16, {F, C});
    Tensor o = alloc(DType::bf16, {N, F}), dout = upload(randn(N * F, 9), DType::bf16, {N, F});
    Tensor din = alloc(DType::bf16, {N, C}), dwl = alloc(DType::f32, {F, C});
    const double flops = 2.0 * N * C * F;
    report_flops("linear_forward N x C -> F", flops, time_ms([&] { ops::linear_forward(gpu, o, x, wl, Tensor{}); }));
    report_flops("linear_backward din+dweight(f32)", 2 * flops,
                 time_ms([&] { ops::linear_backward(gpu, din, dwl, Tensor{}, dout, x, wl); }));
  }
  {
    Tensor qkv = upload(randn(N * Htot * D, 10), DType::bf16, {B, T, Htot, D});
    Tensor ao = alloc(DType::bf16, {B, T, Hq, D}), lse = alloc(DType::f32, {B, Hq, T});
    Tensor dao = upload(randn(N * Hq * D, 11), DType::bf16, {B, T, Hq, D});
    Tensor dqkv = alloc(DType::bf16, {B, T, Htot, D});
    Tensor pos = upload_i32(randint(N, 0, int32_t(T), 12), {N});
    Floats inv(D / 2);
    for (int64_t i = 0; i < D / 2; ++i) inv[i] = float(1.0 / std::pow(10000.0, 2.0 * i / D));
    Tensor inv_freq = upload(inv, DType::f32, {D / 2});
    Tensor qw = upload(randn(D, 13), DType::bf16, {D}), kw = upload(randn(D, 14), DType::bf16, {D});
    Tensor qkv_normed = alloc(DType::bf16, {N, Htot, D}), qk_rstd = alloc(DType::f32, {N, Hq + Hkv});
    report_bytes("qk_norm_forward", 2 * e * N * Htot * D, time_ms([&] {
      ops::qk_norm_forward(gpu, qkv_normed, qk_rstd, qkv.view({N, Htot, D}), qw, kw, int(Hq), int(Hkv), 1e-6);
    }));
    report_bytes("rope_forward (q and k heads)", 2 * e * N * (Hq + Hkv) * D, time_ms([&] {
      ops::rope_forward(gpu, qkv_normed, pos, inv_freq, int(Hq + Hkv));
    }));
    const double flops = 4.0 * B * T * T * Hq * D / 2;  // causal: half of QK^T and PV
    report_flops("attention_forward (causal)", flops, time_ms([&] {
      ops::attention_forward(gpu, ao, lse, qkv, Tensor{}, int(Hq), int(Hkv), 1.0 / std::sqrt(double(D)));
    }, 1, 5));
    report_flops("attention_backward (causal, 2.5x fwd)", 2.5 * flops, time_ms([&] {
      ops::attention_backward(gpu, dqkv, dao, ao, lse, qkv, Tensor{}, int(Hq), int(Hkv), 1.0 / std::sqrt(double(D)));
    }, 1, 5));
  }
  for (const int64_t Vc : {int64_t(128256), int64_t(151936)}) {  // an LM-head chunk of 4096 tokens
    const int64_t Nc = 4096;
    Tensor logits = random_device(DType::bf16, {Nc, Vc}, 15, 2.0);
    Tensor targets = upload_i32(randint(Nc, 0, int32_t(Vc), 16), {Nc});
    Tensor losses = alloc(DType::f32, {Nc});
    report_bytes("cross_entropy in place (V=" + std::to_string(Vc) + ")", 3 * e * Nc * Vc, time_ms([&] {
      ops::cross_entropy(gpu, losses, logits, logits, targets, 1.0 / Nc);
    }));
  }
  {
    const int64_t n = int64_t(1) << 28;  // 268M parameters
    Tensor p = random_device(DType::bf16, {n}, 17), g = random_device(DType::bf16, {n}, 18);
    Tensor m = random_device(DType::f32, {n}, 19, 0.01), master = random_device(DType::f32, {n}, 20);
    Tensor v = random_device(DType::f32, {n}, 21, 0.01, /*positive=*/true);
    AdamWSetting h;
    h.lr = 1e-4;
    h.step = 1;
    h.divisor = 1;
    h.max_norm = 1.0;
    Tensor scalars = upload_f64(adamw_scalars(h), {ops::kAdamWSlots});
    Tensor runs = upload_i64({0, n}, {1, 2});
    // Bytes: grads read twice (sum of squares, update); p, m, v and master read and written.
    report_bytes("adamw_step (bf16 p/g, f32 m/v/master)", n * (2 + 2 + 2 + 12 + 2 + 12.0), time_ms([&] {
      ops::adamw_step(gpu, p, g, m, v, master, runs, scalars, h.constants);
    }));
    Tensor sum = alloc(DType::f64, {1});
    report_bytes("sum_squares_async bf16", e * n, time_ms([&] {
      cuda::sum_squares_async(gpu, &g, 1, static_cast<double*>(sum.data));
    }));
    report_bytes("sum_to bf16", e * n, time_ms([&] { ops::sum_to(gpu, sum, g, false); }));
  }
}

// The ceilings docs/perf.md and docs/kernel-notes.md measure kernels against: a bf16 GEMM of
// 8192^3 (cuBLASLt through linear_forward), in a burst and after ~1.5 s of back-to-back calls
// (under the power cap the clock falls), and a device-to-device copy of 1 GiB (bytes read +
// written), far past the 50 MB L2.
TEST_F(CudaPerf, Ceilings) {
  std::printf("Ceilings on %s\n", cuda::device_name().c_str());
  const int64_t S = 8192;
  Tensor a = random_device(DType::bf16, {S, S}, 21), b = random_device(DType::bf16, {S, S}, 22, 0.02);
  Tensor c = alloc(DType::bf16, {S, S});
  const double flops = 2.0 * S * S * S;
  auto gemm = [&] { ops::linear_forward(gpu, c, a, b, Tensor{}); };
  report_flops("bf16 GEMM 8192^3, burst", flops, time_ms(gemm, 3, 10));
  report_flops("bf16 GEMM 8192^3, sustained", flops, time_ms(gemm, 1000, 200));
  const int64_t n = int64_t(1) << 29;  // 1 GiB of bf16
  Tensor src = random_device(DType::bf16, {n}, 23), dst = alloc(DType::bf16, {n});
  report_bytes("copy 1 GiB (read + written)", 2.0 * 2.0 * n, time_ms([&] { ops::copy(gpu, dst, src); }));
}

// The memory-bound ops at the shapes of the models Ingot trains (N = 16384 tokens, bf16), each
// timed over several buffer sets in rotation so that repeated runs do not measure the L2 cache.
// "args-once" counts every tensor argument once (the step-level op timing's metric); "moved" is
// the fewest bytes the op must move (in-place tensors read and written; rope: rotated heads only).
// docs/kernel-notes.md keeps the numbers.
TEST_F(CudaPerf, NormRopeShapes) {
  struct Model {
    const char* name;
    int64_t C, Hq, Hkv, D, F;
    bool qk_norm;
  };
  const Model models[] = {{"Llama-3.2-1B", 2048, 32, 8, 64, 8192, false},
                          {"Qwen3-0.6B", 1024, 16, 8, 128, 3072, true},
                          {"Qwen2.5-0.5B", 896, 14, 2, 64, 4864, false}};
  const int64_t N = 16384;
  const double e = 2.0;
  std::printf("Ingot memory-bound ops on %s, N=%ld, bf16 (median of 10 after 3 warm-ups)\n",
              cuda::device_name().c_str(), long(N));
  auto report = [](const std::string& name, double args_bytes, double moved_bytes, double ms) {
    std::printf("  %-40s %8.4f ms %8.1f GB/s args-once %8.1f GB/s moved\n", name.c_str(), ms,
                args_bytes / (ms * 1e-3) / 1e9, moved_bytes / (ms * 1e-3) / 1e9);
  };
  // Buffer sets so that the rotation spans >= 384 MB (several times the 50 MB L2); 2..8 sets.
  auto sets_for = [](double bytes_per_set) {
    return int(std::clamp(std::ceil(384e6 / bytes_per_set), 2.0, 8.0));
  };
  uint64_t seed = 1000;
  for (const Model& m : models) {
    const int64_t C = m.C, Hq = m.Hq, Hkv = m.Hkv, D = m.D, F = m.F, Htot = Hq + 2 * Hkv;
    const std::string tag = std::string(m.name) + " ";
    {  // RMSNorm (C)
      const int K = sets_for(4 * e * N * C);
      std::vector<Tensor> x, g, din, out, rstd;
      for (int k = 0; k < K; ++k) {
        x.push_back(random_device(DType::bf16, {N, C}, ++seed));
        g.push_back(random_device(DType::bf16, {N, C}, ++seed));
        din.push_back(random_device(DType::bf16, {N, C}, ++seed));
        out.push_back(alloc(DType::bf16, {N, C}));
        rstd.push_back(random_device(DType::f32, {N}, ++seed, 1.0, /*positive=*/true));
      }
      Tensor w = upload(randn(C, ++seed, 0.5, 1.0), DType::bf16, {C});
      Tensor dw = upload(randn(C, ++seed), DType::f32, {C});
      int i = 0;
      report(tag + "rmsnorm_forward C=" + std::to_string(C), 2 * e * N * C, 2 * e * N * C, time_ms([&] {
        const int k = i++ % K;
        ops::rmsnorm_forward(gpu, out[k], rstd[k], x[k], w, 1e-5);
      }));
      report(tag + "rmsnorm_backward (din acc, f32 dw)", 3 * e * N * C, 4 * e * N * C, time_ms([&] {
        const int k = i++ % K;
        ops::rmsnorm_backward(gpu, din[k], dw, g[k], x[k], w, rstd[k]);
      }));
    }
    {  // RoPE over packed qkv, and Qwen3's qk-norm
      const double qkv_bytes = e * N * Htot * D, rotated_bytes = e * N * (Hq + Hkv) * D;
      const int K = sets_for(3 * qkv_bytes);
      std::vector<Tensor> qkv, dqkv, din, out, rstd;
      for (int k = 0; k < K; ++k) {
        qkv.push_back(random_device(DType::bf16, {N, Htot, D}, ++seed));
        dqkv.push_back(random_device(DType::bf16, {N, Htot, D}, ++seed));
        din.push_back(alloc(DType::bf16, {N, Htot, D}));
        out.push_back(alloc(DType::bf16, {N, Htot, D}));
        rstd.push_back(random_device(DType::f32, {N, Hq + Hkv}, ++seed, 1.0, /*positive=*/true));
      }
      Tensor pos = upload_i32(randint(N, 0, 4096, ++seed), {N});
      Floats inv(D / 2);
      for (int64_t j = 0; j < D / 2; ++j) inv[j] = float(1.0 / std::pow(500000.0, 2.0 * j / D));
      Tensor inv_freq = upload(inv, DType::f32, {D / 2});
      const std::string heads = " (" + std::to_string(Hq + Hkv) + "/" + std::to_string(Htot) +
                                " heads, D=" + std::to_string(D) + ")";
      int i = 0;
      report(tag + "rope_forward" + heads, qkv_bytes, 2 * rotated_bytes, time_ms([&] {
        ops::rope_forward(gpu, qkv[i++ % K], pos, inv_freq, int(Hq + Hkv));
      }));
      report(tag + "rope_backward" + heads, qkv_bytes, 2 * rotated_bytes, time_ms([&] {
        ops::rope_backward(gpu, dqkv[i++ % K], pos, inv_freq, int(Hq + Hkv));
      }));
      if (m.qk_norm) {
        Tensor qw = upload(randn(D, ++seed, 0.5, 1.0), DType::bf16, {D});
        Tensor kw = upload(randn(D, ++seed, 0.5, 1.0), DType::bf16, {D});
        Tensor dqw = upload(randn(D, ++seed), DType::f32, {D}), dkw = upload(randn(D, ++seed), DType::f32, {D});
        report(tag + "qk_norm_forward", 2 * qkv_bytes, 2 * qkv_bytes, time_ms([&] {
          const int k = i++ % K;
          ops::qk_norm_forward(gpu, out[k], rstd[k], qkv[k], qw, kw, int(Hq), int(Hkv), 1e-6);
        }));
        report(tag + "qk_norm_backward (f32 dq/dk weight)", 3 * qkv_bytes, 3 * qkv_bytes, time_ms([&] {
          const int k = i++ % K;
          ops::qk_norm_backward(gpu, din[k], dqw, dkw, dqkv[k], qkv[k], qw, kw, rstd[k], int(Hq), int(Hkv));
        }));
      }
    }
    {  // SwiGLU (F)
      const int K = sets_for(8 * e * N * F);
      std::vector<Tensor> gu, dgu, hidden, dhidden;
      for (int k = 0; k < K; ++k) {
        gu.push_back(random_device(DType::bf16, {N, 2 * F}, ++seed, 2.0));
        dgu.push_back(alloc(DType::bf16, {N, 2 * F}));
        hidden.push_back(alloc(DType::bf16, {N, F}));
        dhidden.push_back(random_device(DType::bf16, {N, F}, ++seed));
      }
      int i = 0;
      report(tag + "swiglu_forward F=" + std::to_string(F), 3 * e * N * F, 3 * e * N * F, time_ms([&] {
        const int k = i++ % K;
        ops::swiglu_forward(gpu, hidden[k], gu[k]);
      }));
      report(tag + "swiglu_backward", 5 * e * N * F, 5 * e * N * F, time_ms([&] {
        const int k = i++ % K;
        ops::swiglu_backward(gpu, dgu[k], dhidden[k], gu[k]);
      }));
    }
    if (C == 2048) {  // memory ops at (N, C)
      const int K = sets_for(5 * e * N * C);
      std::vector<Tensor> x, y, x32;
      for (int k = 0; k < K; ++k) {
        x.push_back(random_device(DType::bf16, {N, C}, ++seed));
        y.push_back(random_device(DType::bf16, {N, C}, ++seed));
        x32.push_back(random_device(DType::f32, {N, C}, ++seed));
      }
      int i = 0;
      report(tag + "add_inplace bf16 += bf16", 2 * e * N * C, 3 * e * N * C, time_ms([&] {
        const int k = i++ % K;
        ops::add_inplace(gpu, x[k], y[k]);
      }));
      report(tag + "add_inplace f32 += bf16", 6.0 * N * C, 10.0 * N * C, time_ms([&] {
        const int k = i++ % K;
        ops::add_inplace(gpu, x32[k], y[k]);
      }));
      report(tag + "copy bf16 -> bf16 (memcpy)", 2 * e * N * C, 2 * e * N * C, time_ms([&] {
        const int k = i++ % K;
        ops::copy(gpu, x[k], y[k]);
      }));
      report(tag + "copy bf16 -> f32", 6.0 * N * C, 6.0 * N * C, time_ms([&] {
        const int k = i++ % K;
        ops::copy(gpu, x32[k], y[k]);
      }));
    }
  }
}

// The embedding backward at the LM shapes, for ids spread over the vocabulary, for padded rows
// (documents of ~500 tokens in rows of 4096: 88% of the ids are the padding id 0) and for one id
// everywhere. f32 dtable (the default recipe's gradients), bf16 dout.
TEST_F(CudaPerf, EmbeddingBackward) {
  const int64_t N = 16384;
  std::printf("Ingot embedding_backward on %s, N=%ld, f32 dtable, bf16 dout (median of 10 after 3 warm-ups)\n",
              cuda::device_name().c_str(), long(N));
  struct Shape {
    const char* name;
    int64_t C, V;
  };
  for (const Shape& m : {Shape{"Llama-3.2-1B", 2048, 128256}, Shape{"Qwen2.5-0.5B", 896, 151936}}) {
    Tensor dout = random_device(DType::bf16, {N, m.C}, 2000);
    Tensor dtable = alloc(DType::f32, {m.V, m.C});
    for (const auto& [label, padding_share] : {std::pair{"ids spread", 0.0}, std::pair{"padded rows, 88% id 0", 0.88},
                                               std::pair{"one id", 1.0}}) {
      std::vector<int32_t> ids = randint(N, 1, int32_t(m.V), 2001);
      for (int64_t i = 0; i < N; ++i)
        if ((i % 4096) >= int64_t((1.0 - padding_share) * 4096)) ids[size_t(i)] = 0;
      Tensor gids = upload_i32(ids, {N});
      const double ms = time_ms([&] { ops::embedding_backward(gpu, dtable, dout, gids); });
      std::printf("  %-14s %-24s %9.3f ms\n", m.name, label, ms);
    }
  }
}

}  // namespace
}  // namespace ingot::test
