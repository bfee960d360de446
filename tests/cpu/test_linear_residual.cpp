// linear_forward with a residual input: out = in @ W^T + bias + residual, residual separate or
// aliasing out. Tolerance: float64 1e-14 norm-wise against the unfused sequence.
#include <gtest/gtest.h>

#include "ingot/ops/ops.h"
#include "test_util.h"

using namespace ingot;

TEST(LinearResidual, MatchesSeparateAddSeparateAndAliased) {
  const int64_t N = 37, I = 50, O = 29;
  std::vector<double> in(N * I), w(O * I), b(O), res(N * O);
  test::fill_normal(in, 1);
  test::fill_normal(w, 2);
  test::fill_normal(b, 3);
  test::fill_normal(res, 4);
  Context ctx;
  ctx.num_threads = 2;
  auto T2 = [](std::vector<double>& v, int64_t r, int64_t c) { return Tensor(v.data(), DType::f64, Device::cpu, {r, c}); };
  std::vector<double> reference(N * O, 0.0), fused(N * O, -7.0), aliased = res;
  ops::linear_forward(ctx, T2(reference, N, O), T2(in, N, I), T2(w, O, I), Tensor(b.data(), DType::f64, Device::cpu, {O}));
  for (int64_t i = 0; i < N * O; ++i) reference[i] += res[i];
  ops::linear_forward(ctx, T2(fused, N, O), T2(in, N, I), T2(w, O, I), Tensor(b.data(), DType::f64, Device::cpu, {O}),
                      T2(res, N, O));
  ops::linear_forward(ctx, T2(aliased, N, O), T2(in, N, I), T2(w, O, I), Tensor(b.data(), DType::f64, Device::cpu, {O}),
                      T2(aliased, N, O));
  EXPECT_LE(test::relative_error(fused, reference), 1e-14);
  EXPECT_LE(test::relative_error(aliased, reference), 1e-14);
}
