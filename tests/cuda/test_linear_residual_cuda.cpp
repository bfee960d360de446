// CUDA linear_forward with a residual (cuBLASLt C input) against the CPU twin: bf16 inputs,
// norm-wise relative error <= 1e-2; output poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda_test_util.h"
#include "ingot/core/arena.h"
#include "ingot/ops/cuda/device.h"
#include "ingot/ops/ops.h"
#include "test_util.h"

using namespace ingot;

TEST(CudaLinearResidual, MatchesCpu) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const int64_t N = 300, I = 256, O = 192;
  std::vector<float> in(N * I), w(O * I), res(N * O);
  test::fill_normal(in, test::test_seed(11));
  test::fill_normal(w, test::test_seed(12), 0.05);
  test::fill_normal(res, test::test_seed(13));
  auto round_bf16 = [](std::vector<float>& v) { for (float& x : v) x = bf16_to_f32(f32_to_bf16(x)); };
  round_bf16(in), round_bf16(w), round_bf16(res);
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    return h;
  };
  Context cpu;
  std::vector<float> expected(N * O);
  ops::linear_forward(cpu, Tensor(expected.data(), DType::f32, Device::cpu, {N, O}),
                      Tensor(in.data(), DType::f32, Device::cpu, {N, I}), Tensor(w.data(), DType::f32, Device::cpu, {O, I}),
                      Tensor(), Tensor(res.data(), DType::f32, Device::cpu, {N, O}));

  Context gpu;
  gpu.device = Device::cuda;
  gpu.cuda = cuda::create_state(0);
  {
    Arena arena("test", Device::cuda);
    arena.reserve(int64_t{8} << 20);
    Tensor d_in = arena.allocate(DType::bf16, {N, I}), d_w = arena.allocate(DType::bf16, {O, I});
    Tensor d_res = arena.allocate(DType::bf16, {N, O}), d_out = arena.allocate(DType::bf16, {N, O});
    copy_from_host(gpu, d_in, to_bf16(in).data());
    copy_from_host(gpu, d_w, to_bf16(w).data());
    copy_from_host(gpu, d_res, to_bf16(res).data());
    const std::vector<uint16_t> poison(N * O, 0x7fc0);  // NaN
    copy_from_host(gpu, d_out, poison.data());
    ops::linear_forward(gpu, d_out, d_in, d_w, Tensor(), d_res);
    std::vector<double> got = to_host_doubles(gpu, d_out);
    EXPECT_LE(test::relative_error(got, std::vector<double>(expected.begin(), expected.end())), 1e-2);
    // In place: the residual stream itself receives the product.
    ops::linear_forward(gpu, d_res, d_in, d_w, Tensor(), d_res);
    got = to_host_doubles(gpu, d_res);
    EXPECT_LE(test::relative_error(got, std::vector<double>(expected.begin(), expected.end())), 1e-2);
  }
  cuda::destroy_state(gpu.cuda);
}
