// sum_to: out (1, f64) = sum of x, or += it. Fixed-size chunks are summed in double and the chunk
// sums added in chunk order, so the result is bit-identical for any thread count.
#include <algorithm>
#include <vector>

#include "ingot/ops/cpu/cpu_common.h"

namespace ingot::cpu {

void sum_to(Context& ctx, Tensor out, Tensor x, bool accumulate) {
  constexpr const char* op = "sum_to";
  detail::check_tensor(op, "out", out, DType::f64);
  detail::check_numel(op, "out", out, 1);
  INGOT_CHECK(x.present() && x.device == Device::cpu, op, ": x must be a present host tensor");
  const int64_t n = x.numel();
  constexpr int64_t kChunk = 4096;
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(n_chunks));
  auto run = [&](auto load) {
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t c = 0; c < n_chunks; ++c) {
      double acc = 0;
      for (int64_t i = c * kChunk, end = std::min(n, (c + 1) * kChunk); i < end; ++i) acc += load(i);
      partial[c] = acc;
    }
  };
  switch (x.dtype) {
    case DType::f32: run([p = x.ptr<float>()](int64_t i) { return double(p[i]); }); break;
    case DType::f64: run([p = x.ptr<double>()](int64_t i) { return p[i]; }); break;
    case DType::bf16: run([p = x.ptr<uint16_t>()](int64_t i) { return double(bf16_to_f32(p[i])); }); break;
    case DType::f16: run([p = x.ptr<uint16_t>()](int64_t i) { return double(f16_to_f32(p[i])); }); break;
    default: fail(op, ": unsupported dtype ", dtype_name(x.dtype), " on the CPU backend");
  }
  double total = 0;
  for (double p : partial) total += p;
  double* o = out.ptr<double>();
  *o = accumulate ? *o + total : total;
}

}  // namespace ingot::cpu
