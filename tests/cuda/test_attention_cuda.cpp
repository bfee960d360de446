// Causal GQA attention on CUDA: the cuDNN fused path (attention_cudnn.cu), the tensor-core
// kernels (attention_mma_*.cu: packed rows, whole rows under INGOT_ATTENTION=mma) and the packed-row
// forward split between them (attention_documents.h) against the CPU twin, the dispatch rules,
// determinism, and (INGOT_CUDA_PERF=1) the speed of every CUDA path.
//
// Tolerances (docs/cuda.md): bf16 out, dq, dk, dv norm-wise relative error <= 1e-2; f32 lse
// <= 1e-4. Inputs are bf16-rounded normals; the CPU runs in f32 on the same values. CUDA outputs
// are poisoned with NaN first. The backward gets identical saved tensors on both sides (out
// rounded to bf16, the CPU's lse).
//
// Determinism: the tensor-core kernels and the default cuDNN backward plan compute dQ without
// atomics and are asserted bitwise reproducible here, eagerly and in a graph replay;
// INGOT_ATTENTION=cudnn-fast selects the plan that accumulates dQ with f32 atomics (measured not
// reproducible at the perf shapes), checked against the tolerance only.
//
// Perf mode: INGOT_CUDA_PERF=1 ./ingot_cuda_tests --gtest_filter='CudaAttention*Perf*' prints the
// median time and TFLOP/s (causal: fwd 2*2*B*Hq*T*T*D/2, bwd 2.5x fwd) of each path: Perf at B=4,
// T=4096 for the Llama-3.2-1B, Qwen3-0.6B and Qwen2.5-0.5B attention shapes; PerfShortSequences
// at 64..2048 tokens; PerfPackedRows on packed rows at Llama-3.2-1B's heads; PerfBackwardSplit the
// backward in several cuDNN calls at long sequences (each test's comment).
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
#include <vector>

#include "cuda_test_util.h"
#include "ingot/core/context.h"
#include "ingot/core/dtype.h"
#include "ingot/core/tensor.h"
#include "ingot/ops/cuda/attention_cudnn.h"
#include "ingot/ops/cuda/attention_documents.h"
#include "ingot/ops/cuda/attention_mma.h"
#include "ingot/ops/cuda/device.h"
#include "ingot/ops/ops.h"
#include "test_util.h"

namespace ingot::test {
namespace {

constexpr double kTolBf16 = 1e-2;
constexpr double kTolStat = 1e-4;

using Floats = std::vector<float>;

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

Floats randn_bf16(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(test_seed(seed));
  std::normal_distribution<double> dist(0.0, 1.0);
  Floats v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = round_bf16(float(dist(rng)));
    if (x == 0.f) x = 0.0078125f;
  }
  return v;
}

// Sets INGOT_ATTENTION for one scope.
struct ScopedMode {
  std::string old;
  bool had;
  explicit ScopedMode(const char* mode) {
    const char* e = std::getenv("INGOT_ATTENTION");
    had = e != nullptr;
    if (had) old = e;
    if (mode) setenv("INGOT_ATTENTION", mode, 1);
    else unsetenv("INGOT_ATTENTION");
  }
  ~ScopedMode() {
    if (had) setenv("INGOT_ATTENTION", old.c_str(), 1);
    else unsetenv("INGOT_ATTENTION");
  }
};

// Sets INGOT_ATTENTION_MMA_SYNC (the tensor-core kernels on mma.sync even on Hopper) for one scope.
struct ScopedMmaSync {
  explicit ScopedMmaSync(bool on) {
    if (on) setenv("INGOT_ATTENTION_MMA_SYNC", "1", 1);
  }
  ~ScopedMmaSync() { unsetenv("INGOT_ATTENTION_MMA_SYNC"); }
};

struct Case {
  int64_t B, T, Hq, Hkv, D;
  std::string describe() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " Hq=" + std::to_string(Hq) +
           " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D);
  }
};

// One case's inputs and the CPU twin's results. The backward gets identical saved tensors on both
// sides: out rounded to bf16 and the CPU's lse.
struct Reference {
  Floats qkv, dout, out, lse, out16, dqkv;
};

// The shared fixture with eight CPU threads for the reference attention, plus large random inputs.
class CudaAttention : public CudaFixture {
 protected:
  void SetUp() override {
    CudaFixture::SetUp();
    cpu.num_threads = 8;
  }
  // The perf tests' problem: random qkv (B,T,Hq+2Hkv,D) and dout (B,T,Hq,D) from seeds seed and
  // seed + 1; out, lse and dqkv allocated for the ops to write.
  struct Problem {
    Tensor qkv, dout, out, lse, dqkv;
  };
  Problem random_problem(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, uint64_t seed) {
    const int64_t Htot = Hq + 2 * Hkv;
    Problem p;
    p.qkv = alloc(DType::bf16, {B, T, Htot, D});
    p.dout = alloc(DType::bf16, {B, T, Hq, D});
    fill_random(p.qkv, seed);
    fill_random(p.dout, seed + 1);
    p.out = alloc(DType::bf16, {B, T, Hq, D});
    p.lse = alloc(DType::f32, {B, Hq, T});
    p.dqkv = alloc(DType::bf16, {B, T, Htot, D});
    return p;
  }
  // Forward under INGOT_ATTENTION=`mode` and backward under each of `backward_modes` against the
  // CPU twin; each call must take the path of that name (for the default, null: default_path, and
  // default_backward_path for the backward where given).
  void expect_matches_cpu(const Case& c, const Reference& ref, const std::vector<int32_t>& seg,
                          const char* mode, std::initializer_list<const char*> backward_modes,
                          const char* default_path = "cudnn", const char* default_backward_path = nullptr);
  // Large random bf16 tensor: a 1M-element random block repeated at shifting offsets.
  void fill_random(Tensor t, uint64_t seed) {
    const int64_t n = t.numel(), block = int64_t(1) << 20;
    const Floats v = randn_bf16(block + 4096, seed);
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
    for (int64_t at = 0, k = 0; at < n; at += block, ++k) {
      const int64_t count = std::min(block, n - at), shift = (k * 977) % 4096;
      cuda::copy_to_device(static_cast<char*>(t.data) + at * 2, bits.data() + shift, count * 2, state_);
    }
  }
};

::testing::AssertionResult close(const Floats& got, const Floats& want, double tol, const std::string& what) {
  const double err = relative_error(got.data(), want.data(), int64_t(want.size()));
  std::printf("    %-58s rel err %.3e\n", what.c_str(), err);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": rel err " << err << " > " << tol;
}

// Heads [h0, h1) of packed (N, H, D) rows.
Floats heads_of(const Floats& v, int64_t N, int64_t H, int64_t D, int64_t h0, int64_t h1) {
  Floats out;
  out.reserve(size_t(N * (h1 - h0) * D));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t d = 0; d < D; ++d) out.push_back(v[size_t((n * H + h) * D + d)]);
  return out;
}

Reference cpu_reference(Context& cpu, const Case& c, std::vector<int32_t> seg, uint64_t seed) {
  const int64_t Htot = c.Hq + 2 * c.Hkv, N = c.B * c.T;
  const double scale = 1.0 / std::sqrt(double(c.D));
  Reference r;
  r.qkv = randn_bf16(N * Htot * c.D, seed);
  r.dout = randn_bf16(N * c.Hq * c.D, seed + 1);
  r.out.resize(size_t(N * c.Hq * c.D));
  r.lse.resize(size_t(c.B * c.Hq * c.T));
  r.dqkv.resize(r.qkv.size());
  Floats qkv = r.qkv, dout = r.dout;
  Tensor qkv_t(qkv.data(), DType::f32, Device::cpu, {c.B, c.T, Htot, c.D});
  Tensor out_t(r.out.data(), DType::f32, Device::cpu, {c.B, c.T, c.Hq, c.D});
  Tensor lse_t(r.lse.data(), DType::f32, Device::cpu, {c.B, c.Hq, c.T});
  Tensor seg_t = seg.empty() ? Tensor{} : Tensor(seg.data(), DType::i32, Device::cpu, {c.B, c.T});
  ops::attention_forward(cpu, out_t, lse_t, qkv_t, seg_t, int(c.Hq), int(c.Hkv), scale);
  r.out16 = r.out;
  for (auto& f : r.out16) f = round_bf16(f);
  Tensor out16_t(r.out16.data(), DType::f32, Device::cpu, {c.B, c.T, c.Hq, c.D});
  Tensor dout_t(dout.data(), DType::f32, Device::cpu, {c.B, c.T, c.Hq, c.D});
  Tensor dqkv_t(r.dqkv.data(), DType::f32, Device::cpu, {c.B, c.T, Htot, c.D});
  ops::attention_backward(cpu, dqkv_t, dout_t, out16_t, lse_t, qkv_t, seg_t, int(c.Hq), int(c.Hkv), scale);
  return r;
}

// Packed rows as the loader builds them: documents of random length with ids 0, 1, 2, ..., then
// padding (id -1) over the last ~tenth of each row.
std::vector<int32_t> packed_rows(int64_t B, int64_t T, uint64_t seed) {
  std::vector<int32_t> ids = make_segments(B, T, seed);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = T - T / 10; t < T; ++t) ids[size_t(b * T + t)] = -1;
  return ids;
}

// Ids that are not sorted: runs of 7 tokens cycling through 3 ids, so that a document's tokens
// are scattered over the whole row (the ops.h contract allows any ids).
std::vector<int32_t> scattered_ids(int64_t B, int64_t T) {
  std::vector<int32_t> ids(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) ids[size_t(b * T + t)] = int32_t((t / 7 + b) % 3);
  return ids;
}

void CudaAttention::expect_matches_cpu(const Case& c, const Reference& ref, const std::vector<int32_t>& seg,
                                       const char* mode, std::initializer_list<const char*> backward_modes,
                                       const char* default_path, const char* default_backward_path) {
  const int64_t Htot = c.Hq + 2 * c.Hkv, N = c.B * c.T;
  const double scale = 1.0 / std::sqrt(double(c.D));
  const std::string name = c.describe() + (seg.empty() ? "" : " +segments");
  std::printf("  %s\n", name.c_str());
  Tensor gseg;
  if (!seg.empty()) {
    gseg = alloc(DType::i32, {c.B, c.T});
    cuda::copy_to_device(gseg.data, seg.data(), gseg.bytes(), state_);
  }
  auto path_of = [&](const char* m) { return m ? m : default_path; };

  Tensor gqkv = alloc(DType::bf16, {c.B, c.T, Htot, c.D});
  write(gqkv, ref.qkv);
  Tensor gout = alloc(DType::bf16, {c.B, c.T, c.Hq, c.D}), glse = alloc(DType::f32, {c.B, c.Hq, c.T});
  poison(gout);
  poison(glse);
  {
    ScopedMode scoped(mode);
    ops::attention_forward(gpu, gout, glse, gqkv, gseg, int(c.Hq), int(c.Hkv), scale);
  }
  EXPECT_STREQ(cuda::attention_last_path(), path_of(mode)) << name;
  EXPECT_TRUE(close(download(gout), ref.out, kTolBf16, "forward out"));
  EXPECT_TRUE(close(download(glse), ref.lse, kTolStat, "forward lse"));

  Tensor gout16 = alloc(DType::bf16, {c.B, c.T, c.Hq, c.D}), gdout = alloc(DType::bf16, {c.B, c.T, c.Hq, c.D});
  Tensor glse_c = alloc(DType::f32, {c.B, c.Hq, c.T}), gdqkv = alloc(DType::bf16, {c.B, c.T, Htot, c.D});
  write(gout16, ref.out16);
  write(gdout, ref.dout);
  write(glse_c, ref.lse);
  for (const char* variant : backward_modes) {
    poison(gdqkv);
    {
      ScopedMode scoped(variant);
      ops::attention_backward(gpu, gdqkv, gdout, gout16, glse_c, gqkv, gseg, int(c.Hq), int(c.Hkv), scale);
    }
    EXPECT_STREQ(cuda::attention_last_path(),
                 !variant && default_backward_path ? default_backward_path : path_of(variant))
        << name;
    const Floats got = download(gdqkv);
    const int64_t bounds[4] = {0, c.Hq, c.Hq + c.Hkv, Htot};
    const char* parts[3] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; ++p)
      EXPECT_TRUE(close(heads_of(got, N, Htot, c.D, bounds[p], bounds[p + 1]),
                        heads_of(ref.dqkv, N, Htot, c.D, bounds[p], bounds[p + 1]), kTolBf16,
                        std::string("backward ") + parts[p] + " (" + path_of(variant) + ")"))
          << name;
  }
}

TEST_F(CudaAttention, CudnnMatchesCpu) {
  if (!cuda::attention_cudnn_compiled()) GTEST_SKIP() << "built without cuDNN";
  for (int64_t D : {64, 128})
    for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 4}})
      for (int64_t T : {77, 1024}) {
        const Case c{2, T, Hq, Hkv, D};
        expect_matches_cpu(c, cpu_reference(cpu, c, {}, uint64_t(7 + T + D)), {}, nullptr, {nullptr, "cudnn-fast"});
      }
  // Qwen2.5's grouping (14 query heads to 2 kv heads, 7 a group), and head dims other models use.
  for (const Case& c : {Case{2, 300, 14, 2, 64}, Case{1, 200, 4, 2, 32}, Case{1, 200, 4, 2, 80},
                        Case{2, 129, 4, 1, 96}})
    expect_matches_cpu(c, cpu_reference(cpu, c, {}, uint64_t(11 + c.T + c.D)), {}, nullptr, {nullptr, "cudnn-fast"});
}

// The tensor-core kernels (INGOT_ATTENTION=mma forces them where cuDNN would run): whole rows, the
// loader's packed rows with padding, and unsorted ids, which the tile skipping must not get wrong.
// On Hopper every case runs twice: on the wgmma kernels (the default there) and on the mma.sync
// ones (INGOT_ATTENTION_MMA_SYNC), which every other GPU takes.
TEST_F(CudaAttention, MmaMatchesCpu) {
  // On an sm_90 device a build with sm_90a code (the default) must take the wgmma kernels, or this
  // test would quietly check only the mma.sync ones.
  const bool sm90a_build = std::string(INGOT_CUDA_ARCHITECTURES).find("90a") != std::string::npos;
  if (cuda::device_compute_capability() == 90 && sm90a_build)
    ASSERT_TRUE(cuda::attention_wgmma_available(gpu, 64) && cuda::attention_wgmma_available(gpu, 128))
        << "sm_90 device, build for " << INGOT_CUDA_ARCHITECTURES << ", and no wgmma kernels";
  auto check = [&](const Case& c, const Reference& ref, const std::vector<int32_t>& seg) {
    const bool wgmma = cuda::attention_wgmma_available(gpu, int(c.D));
    for (bool force_sync : {false, true}) {
      if (force_sync && !wgmma) continue;
      ScopedMmaSync scoped(force_sync);
      expect_matches_cpu(c, ref, seg, "mma", {"mma"});
      EXPECT_STREQ(cuda::attention_mma_kernels(), wgmma && !force_sync ? "wgmma" : "mma.sync")
          << c.describe();
    }
  };
  // Groups of 4 (Llama), 1, and 7 (Qwen2.5-0.5B's 14 query heads over 2 kv heads).
  for (int64_t D : {64, 128})
    for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 4}, {14, 2}})
      for (int64_t T : {77, 300}) {
        const Case c{2, T, Hq, Hkv, D};
        const uint64_t seed = uint64_t(17 + T + D + Hkv);
        for (const auto& seg : {std::vector<int32_t>{}, packed_rows(c.B, c.T, seed), scattered_ids(c.B, c.T)})
          check(c, cpu_reference(cpu, c, seg, seed), seg);
      }
  // Rows shorter than a tile, and a last tile of one row.
  for (int64_t D : {64, 128})
    for (int64_t T : {1, 63, 65}) {
      const Case c{2, T, 4, 2, D};
      const uint64_t seed = uint64_t(31 + T + D);
      for (const auto& seg : {std::vector<int32_t>{}, packed_rows(c.B, c.T, seed)})
        check(c, cpu_reference(cpu, c, seg, seed), seg);
    }
  // Long packed rows, where most tile pairs are skipped: Llama-3.2-1B's head layout.
  const Case c{1, 2048, 8, 2, 64};
  const std::vector<int32_t> seg = packed_rows(c.B, c.T, 5);
  check(c, cpu_reference(cpu, c, seg, 5), seg);
}

// Rows of documents with the given lengths, cycled, then (with `pad`) padding (id -1) over the
// last tenth: for the lengths around the documents path's split (kLongDocument).
std::vector<int32_t> rows_of_documents(int64_t B, int64_t T, std::vector<int64_t> lengths, bool pad = true) {
  std::vector<int32_t> ids(size_t(B * T));
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    for (int64_t t = 0, left = lengths[next++ % lengths.size()]; t < T; ++t) {
      if (left-- == 0) {
        ++id;
        left = lengths[next++ % lengths.size()] - 1;
      }
      ids[size_t(b * T + t)] = pad && t >= T - T / 10 ? -1 : id;
    }
  }
  return ids;
}

// Packed rows by default: the forward's long documents on cuDNN, the rest on the tensor-core
// kernels, against the CPU twin (the backward: tensor-core kernels). Rows mixing both, documents of exactly kLongDocument and one token fewer,
// a long document running into the padding, rows of only short documents, and unsorted ids
// (which the split leaves wholly to the tensor-core kernels).
TEST_F(CudaAttention, DocumentsMatchCpu) {
  if (!cuda::attention_cudnn_compiled()) GTEST_SKIP() << "built without cuDNN";
  const int64_t L = cuda::kLongDocument;
  for (int64_t D : {64, 128})
    for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 4}}) {
      const Case c{2, 1000, Hq, Hkv, D};
      const uint64_t seed = uint64_t(23 + D + Hkv);
      for (const auto& seg : {packed_rows(c.B, c.T, seed), rows_of_documents(c.B, c.T, {L, L - 1, 3, 2 * L + 5, 70}),
                              rows_of_documents(c.B, c.T, {17, 130, 1, 200}), scattered_ids(c.B, c.T)})
        expect_matches_cpu(c, cpu_reference(cpu, c, seg, seed), seg, nullptr, {nullptr}, "cudnn+mma", "mma");
    }
  // Llama-3.2-1B's head layout on long rows, and a document that fills its row (every block of the
  // tensor-core forward leaves at once; cuDNN writes everything).
  const Case c{2, 2048, 8, 2, 64};
  for (const auto& seg : {packed_rows(c.B, c.T, 5), rows_of_documents(c.B, c.T, {4000}, false)})
    expect_matches_cpu(c, cpu_reference(cpu, c, seg, 5), seg, nullptr, {nullptr}, "cudnn+mma", "mma");
}

// Which path takes a call: cuDNN without segment ids, cuDNN with the tensor-core kernels with
// them (bf16, D = 64 or 128; the tensor-core kernels alone without cuDNN); the CUDA-core kernels
// for any other head dim, for f32, or when asked.
TEST_F(CudaAttention, DispatchPicksThePath) {
  const int64_t B = 1, T = 64, Hq = 2, Hkv = 1, D = 64, Htot = Hq + 2 * Hkv;
  Tensor qkv = alloc(DType::bf16, {B, T, Htot, D});
  write(qkv, randn_bf16(B * T * Htot * D, 3));
  Tensor out = alloc(DType::bf16, {B, T, Hq, D}), lse = alloc(DType::f32, {B, Hq, T});
  Tensor seg = alloc(DType::i32, {B, T});
  std::vector<int32_t> ids(static_cast<size_t>(B * T), 0);
  cuda::copy_to_device(seg.data, ids.data(), seg.bytes(), state_);
  ops::attention_forward(gpu, out, lse, qkv, seg, int(Hq), int(Hkv), 0.125);
  EXPECT_STREQ(cuda::attention_last_path(), cuda::attention_cudnn_compiled() ? "cudnn+mma" : "mma")
      << "segment ids";
  if (cuda::attention_cudnn_compiled()) {
    ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), 0.125);
    EXPECT_STREQ(cuda::attention_last_path(), "cudnn") << "no segment ids";
  }
  {
    ScopedMode mode("mma");
    ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), 0.125);
    EXPECT_STREQ(cuda::attention_last_path(), "mma") << "INGOT_ATTENTION=mma";
    ops::attention_forward(gpu, out, lse, qkv, seg, int(Hq), int(Hkv), 0.125);
    EXPECT_STREQ(cuda::attention_last_path(), "mma") << "INGOT_ATTENTION=mma, segment ids";
  }
  {
    ScopedMode mode("kernels");
    ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), 0.125);
    EXPECT_STREQ(cuda::attention_last_path(), "kernels") << "INGOT_ATTENTION=kernels";
    ops::attention_forward(gpu, out, lse, qkv, seg, int(Hq), int(Hkv), 0.125);
    EXPECT_STREQ(cuda::attention_last_path(), "kernels") << "INGOT_ATTENTION=kernels, segment ids";
  }
  Tensor qkv20 = alloc(DType::bf16, {B, T, Hq + 2 * Hkv, 20});
  write(qkv20, randn_bf16(B * T * Htot * 20, 4));
  Tensor out20 = alloc(DType::bf16, {B, T, Hq, 20});
  ops::attention_forward(gpu, out20, lse, qkv20, seg, int(Hq), int(Hkv), 0.2);
  EXPECT_STREQ(cuda::attention_last_path(), "kernels") << "D % 8 != 0";
  Tensor qkv32 = alloc(DType::f32, {B, T, Htot, D}), out32 = alloc(DType::f32, {B, T, Hq, D});
  write(qkv32, randn_bf16(B * T * Htot * D, 5));
  ops::attention_forward(gpu, out32, lse, qkv32, seg, int(Hq), int(Hkv), 0.125);
  EXPECT_STREQ(cuda::attention_last_path(), "kernels") << "f32";
}

// The tensor-core forward keeps its running maxima over raw scores, which is only right for a
// positive scale: with scale 0 or below it (and the documents path that hands it the short
// documents) declines, and the CUDA-core kernels must still give the CPU twin's answer.
TEST_F(CudaAttention, NonPositiveScaleTakesTheCudaCoreKernels) {
  const int64_t B = 2, T = 150, Hq = 4, Hkv = 2, D = 64, Htot = Hq + 2 * Hkv;
  const Floats qkv_values = randn_bf16(B * T * Htot * D, 71);
  const std::vector<int32_t> ids = packed_rows(B, T, 72);
  Tensor qkv = alloc(DType::bf16, {B, T, Htot, D}), seg = alloc(DType::i32, {B, T});
  write(qkv, qkv_values);
  cuda::copy_to_device(seg.data, ids.data(), seg.bytes(), state_);
  Tensor out = alloc(DType::bf16, {B, T, Hq, D}), lse = alloc(DType::f32, {B, Hq, T});
  for (double scale : {0.0, -0.125}) {
    Floats qkv_cpu = qkv_values, want_out(size_t(B * T * Hq * D)), want_lse(size_t(B * Hq * T));
    std::vector<int32_t> ids_cpu = ids;
    ops::attention_forward(cpu, Tensor(want_out.data(), DType::f32, Device::cpu, {B, T, Hq, D}),
                           Tensor(want_lse.data(), DType::f32, Device::cpu, {B, Hq, T}),
                           Tensor(qkv_cpu.data(), DType::f32, Device::cpu, {B, T, Htot, D}),
                           Tensor(ids_cpu.data(), DType::i32, Device::cpu, {B, T}), int(Hq), int(Hkv), scale);
    poison(out);
    poison(lse);
    ops::attention_forward(gpu, out, lse, qkv, seg, int(Hq), int(Hkv), scale);
    EXPECT_STREQ(cuda::attention_last_path(), "kernels") << "scale " << scale;
    EXPECT_TRUE(close(download(out), want_out, kTolBf16, "forward out, scale " + std::to_string(scale)));
    EXPECT_TRUE(close(download(lse), want_lse, kTolStat, "forward lse, scale " + std::to_string(scale)));
  }
}

// Whole rows whose cuDNN backward workspace (B x Hq x T x T bf16) is above the limit a training
// run sets from its memory plan run the backward as several cuDNN calls over slices of the rows and
// kv heads, with the one call's bits (heads and rows are independent); where not even one row's one
// kv-head group fits, or a slice's lse would not be 16-byte aligned, on the tensor-core kernels.
// The forward stays on cuDNN throughout.
TEST_F(CudaAttention, BackwardSplitsToFitTheWorkspaceLimit) {
  if (!cuda::attention_cudnn_compiled()) GTEST_SKIP() << "built without cuDNN";
  constexpr int64_t MiB = int64_t{1} << 20;
  struct RestoreLimit {
    ~RestoreLimit() { cuda::set_cudnn_backward_workspace_limit(std::numeric_limits<int64_t>::max()); }
  } restore;
  struct Limit {
    int64_t bytes;
    const char* path;
  };
  struct Problem {
    int64_t B, T, Hq, Hkv, D;
    std::vector<Limit> limits;  // after the one call at no limit
  };
  const Problem problems[] = {
      // 64 MiB in one call; 2 rows a call; 1 row; 1 row and 1 kv head (4 query heads); nothing fits.
      {4, 1024, 8, 2, 64, {{64 * MiB, "cudnn"}, {32 * MiB, "cudnn-split"}, {16 * MiB, "cudnn-split"},
                           {8 * MiB, "cudnn-split"}, {4 * MiB, "mma"}}},
      // Qwen3's head dim: 1 row a call; 1 row and 1 kv head (the workspace does not depend on D).
      {2, 1024, 8, 2, 128, {{16 * MiB, "cudnn-split"}, {8 * MiB, "cudnn-split"}}},
      // No grouping: 2 of 4 kv heads a call.
      {1, 1024, 4, 4, 64, {{4 * MiB, "cudnn-split"}}},
      // Hq * T = 2046 floats: one call is fine, but a one-head slice's lse would start 1023 floats in.
      {1, 1023, 2, 2, 64, {{cuda::cudnn_backward_workspace_bytes(1, 1023, 2) - 1, "mma"}}},
  };
  for (const Problem& p : problems) {
    cuda::set_cudnn_backward_workspace_limit(std::numeric_limits<int64_t>::max());
    const auto [qkv, dout, out, lse, dqkv] = random_problem(p.B, p.T, p.Hq, p.Hkv, p.D, 61);
    const std::string shape = std::to_string(p.B) + " x " + std::to_string(p.T) + ", " + std::to_string(p.Hq) + "/" +
                              std::to_string(p.Hkv) + " heads, D = " + std::to_string(p.D);
    ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(p.Hq), int(p.Hkv), 0.125);
    ASSERT_STREQ(cuda::attention_last_path(), "cudnn") << shape;
    poison(dqkv);
    ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(p.Hq), int(p.Hkv), 0.125);
    ASSERT_STREQ(cuda::attention_last_path(), "cudnn") << shape;
    const auto one_call = download_bytes(dqkv);
    const Floats one_call_values = download(dqkv);
    for (const Limit& limit : p.limits) {
      cuda::set_cudnn_backward_workspace_limit(limit.bytes);
      const std::string what = shape + ", limit " + std::to_string(limit.bytes) + " bytes";
      ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(p.Hq), int(p.Hkv), 0.125);
      EXPECT_STREQ(cuda::attention_last_path(), "cudnn") << what;
      poison(dqkv);
      ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(p.Hq), int(p.Hkv), 0.125);
      EXPECT_STREQ(cuda::attention_last_path(), limit.path) << what;
      EXPECT_TRUE(close(download(dqkv), one_call_values, kTolBf16, "dqkv, " + what));
      if (std::strcmp(limit.path, "mma") != 0)
        EXPECT_TRUE(download_bytes(dqkv) == one_call) << what << ": not the one call's bits";
    }
  }
}

// The trainer needs bitwise-repeatable steps captured in one CUDA graph: packed rows on the
// tensor-core kernels alone and with cuDNN (the default), three eager runs and a graph replay each,
// byte for byte, then a replay of the same graph over other documents against their eager run.
TEST_F(CudaAttention, PackedRowsAreBitwiseReproducibleAndReplay) {
  const int64_t B = 2, T = 1000, Hq = 8, Hkv = 2, D = 128, Htot = Hq + 2 * Hkv;
  Tensor qkv = alloc(DType::bf16, {B, T, Htot, D}), dout = alloc(DType::bf16, {B, T, Hq, D});
  write(qkv, randn_bf16(B * T * Htot * D, 41));
  write(dout, randn_bf16(B * T * Hq * D, 42));
  Tensor seg = alloc(DType::i32, {B, T});
  const std::vector<int32_t> ids = packed_rows(B, T, 43), other_ids = packed_rows(B, T, 44);
  ASSERT_NE(ids, other_ids);
  cuda::copy_to_device(seg.data, ids.data(), seg.bytes(), state_);
  Tensor out = alloc(DType::bf16, {B, T, Hq, D}), lse = alloc(DType::f32, {B, Hq, T});
  Tensor dqkv = alloc(DType::bf16, {B, T, Htot, D});
  std::string forward_path;
  auto step = [&] {
    ops::attention_forward(gpu, out, lse, qkv, seg, int(Hq), int(Hkv), 0.088);
    forward_path = cuda::attention_last_path();
    ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, seg, int(Hq), int(Hkv), 0.088);
  };
  auto poison_outputs = [&] {
    for (const Tensor* t : {&out, &lse, &dqkv}) poison(*t);
  };
  auto output_bytes = [&] {  // out, lse and dqkv, one after another
    std::vector<uint8_t> bytes;
    for (const Tensor* t : {&out, &lse, &dqkv}) {
      const auto more = download_bytes(*t);
      bytes.insert(bytes.end(), more.begin(), more.end());
    }
    return bytes;
  };
  for (const char* mode : {"mma", static_cast<const char*>(nullptr)}) {
    const char* path = mode ? mode : cuda::attention_cudnn_compiled() ? "cudnn+mma" : "mma";
    ScopedMode scoped(mode);
    std::vector<std::vector<uint8_t>> runs;
    for (int r = 0; r < 3; ++r) {
      poison_outputs();
      step();
      EXPECT_EQ(forward_path, path);
      EXPECT_STREQ(cuda::attention_last_path(), "mma");
      runs.push_back(output_bytes());
    }
    EXPECT_TRUE(runs[0] == runs[1] && runs[1] == runs[2]) << path << ": eager runs differ";
    poison_outputs();
    capture_and_replay(step);
    EXPECT_TRUE(output_bytes() == runs[0]) << path << ": graph replay differs from the eager runs";

    // The trainer replays one graph for every batch: new documents in the same buffer must change
    // what the replay computes (tile ranges and skipping are derived on the device, not baked in).
    // The replay runs before the eager run over the new ids, so it cannot read tables that run built.
    cuda::copy_to_device(seg.data, other_ids.data(), seg.bytes(), state_);
    poison_outputs();
    cuda::replay(state_);
    cuda::synchronize(state_);
    const std::vector<uint8_t> replayed_other = output_bytes();
    poison_outputs();
    step();
    EXPECT_EQ(forward_path, path);
    const std::vector<uint8_t> eager_other = output_bytes();
    EXPECT_FALSE(eager_other == runs[0]) << path << ": the second documents gave the first ones' outputs";
    EXPECT_TRUE(replayed_other == eager_other) << path << ": a replay with new segment ids differs from eager";
    cuda::copy_to_device(seg.data, ids.data(), seg.bytes(), state_);
  }
}

// The default (deterministic) backward three times, at a small shape and at Llama-3.2-1B's heads at
// 4 x 4096, where the atomics variant (printed, not asserted: it may repeat by chance) has dQ
// contributions from 64 key tiles to reorder.
TEST_F(CudaAttention, CudnnBackwardIsBitwiseReproducible) {
  if (!cuda::attention_cudnn_compiled()) GTEST_SKIP() << "built without cuDNN";
  struct Shape {
    int64_t B, T, Hq, Hkv;
  };
  for (const Shape& shape : {Shape{2, 512, 8, 2}, Shape{4, 4096, 32, 8}}) {
    const int64_t B = shape.B, T = shape.T, Hq = shape.Hq, Hkv = shape.Hkv, D = 64, Htot = Hq + 2 * Hkv;
    Tensor qkv = alloc(DType::bf16, {B, T, Htot, D}), dout = alloc(DType::bf16, {B, T, Hq, D});
    write(qkv, randn_bf16(B * T * Htot * D, 11));
    write(dout, randn_bf16(B * T * Hq * D, 12));
    Tensor out = alloc(DType::bf16, {B, T, Hq, D}), lse = alloc(DType::f32, {B, Hq, T});
    Tensor dqkv = alloc(DType::bf16, {B, T, Htot, D});
    ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), 0.125);
    for (const char* variant : {"cudnn", "cudnn-fast"}) {
      ScopedMode mode(std::strcmp(variant, "cudnn") == 0 ? nullptr : variant);
      std::vector<std::vector<uint8_t>> runs;
      for (int r = 0; r < 3; ++r) {
        poison(dqkv);
        ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), 0.125);
        runs.push_back(download_bytes(dqkv));
      }
      const bool same = runs[0] == runs[1] && runs[1] == runs[2];
      std::printf("  B=%ld T=%ld %ld/%ld heads: backward %-12s three runs bitwise identical: %s\n", long(B),
                  long(T), long(Hq), long(Hkv), variant, same ? "yes" : "no");
      if (std::strcmp(variant, "cudnn") == 0) {
        const std::string path = cuda::attention_last_path();  // one call, or slices of one (same bits)
        EXPECT_TRUE(path == "cudnn" || path == "cudnn-split") << path << " T=" << T;
        EXPECT_TRUE(same) << "T=" << T;
      }
    }
  }
}

TEST_F(CudaAttention, CudnnInsideCudaGraph) {
  // The trainer captures whole steps: the cuDNN plans (built eagerly first) must replay in a graph,
  // the backward's slices (BackwardSplitsToFitTheWorkspaceLimit) too.
  if (!cuda::attention_cudnn_compiled()) GTEST_SKIP() << "built without cuDNN";
  const int64_t B = 2, T = 256, Hq = 8, Hkv = 2, D = 128, Htot = Hq + 2 * Hkv;
  Tensor qkv = alloc(DType::bf16, {B, T, Htot, D}), dout = alloc(DType::bf16, {B, T, Hq, D});
  write(qkv, randn_bf16(B * T * Htot * D, 31));
  write(dout, randn_bf16(B * T * Hq * D, 32));
  Tensor out = alloc(DType::bf16, {B, T, Hq, D}), lse = alloc(DType::f32, {B, Hq, T});
  Tensor dqkv = alloc(DType::bf16, {B, T, Htot, D});
  struct RestoreLimit {
    ~RestoreLimit() { cuda::set_cudnn_backward_workspace_limit(std::numeric_limits<int64_t>::max()); }
  } restore;
  for (const char* variant : {"cudnn", "cudnn-fast", "cudnn-split"}) {
    const bool fast = std::strcmp(variant, "cudnn-fast") == 0, split = std::strcmp(variant, "cudnn-split") == 0;
    ScopedMode mode(fast ? variant : nullptr);
    // cudnn-split: a row's workspace a call, so the backward is two cuDNN calls.
    cuda::set_cudnn_backward_workspace_limit(split ? cuda::cudnn_backward_workspace_bytes(1, T, Hq)
                                                   : std::numeric_limits<int64_t>::max());
    auto step = [&] {
      ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), 0.088);
      ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), 0.088);
    };
    step();  // eager: builds the plans and sizes the scratch
    const auto eager_out = download_bytes(out), eager_lse = download_bytes(lse), eager_dqkv = download_bytes(dqkv);
    const Floats eager_dqkv_values = download(dqkv);
    poison(out);
    poison(lse);
    poison(dqkv);
    capture_and_replay(step);
    EXPECT_STREQ(cuda::attention_last_path(), variant);
    EXPECT_TRUE(download_bytes(out) == eager_out) << variant;
    EXPECT_TRUE(download_bytes(lse) == eager_lse) << variant;
    const bool same = download_bytes(dqkv) == eager_dqkv;
    std::printf("  graph replay, %-20s dqkv bitwise equal to eager: %s\n", variant, same ? "yes" : "no");
    if (!fast) EXPECT_TRUE(same);
    EXPECT_TRUE(close(download(dqkv), eager_dqkv_values, kTolBf16, std::string("graph replay dqkv vs eager (") + variant + ")"));
  }
}

// ---- perf mode --------------------------------------------------------------------------------

TEST_F(CudaAttention, Perf) {
  if (!perf_mode()) GTEST_SKIP() << "set INGOT_CUDA_PERF=1 to run perf mode";
  struct Shape {
    const char* model;
    int64_t Hq, Hkv, D;
  };
  const Shape shapes[] = {{"Llama-3.2-1B", 32, 8, 64}, {"Qwen3-0.6B", 16, 8, 128}, {"Qwen2.5-0.5B", 14, 2, 64}};
  const int64_t B = 4, T = 4096;
  std::vector<std::string> rows;
  for (const Shape& s : shapes) {
    const double scale = 1.0 / std::sqrt(double(s.D));
    const auto [qkv, dout, out, lse, dqkv] = random_problem(B, T, s.Hq, s.Hkv, s.D, 21);
    const double fwd_flops = 4.0 * B * s.Hq * double(T) * T * s.D / 2;
    for (const char* mode : {"kernels", "mma", "mma.sync", "cudnn", "cudnn-fast"}) {
      const bool sync = std::strcmp(mode, "mma.sync") == 0;
      if (sync && !cuda::attention_wgmma_available(gpu, int(s.D))) continue;  // the "mma" row already
      ScopedMode scoped(std::strcmp(mode, "cudnn") == 0 ? nullptr : sync ? "mma" : mode);
      ScopedMmaSync scoped_sync(sync);
      const bool slow = std::strcmp(mode, "kernels") == 0;
      const double f = median_ms(state_, [&] {
        ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(s.Hq), int(s.Hkv), scale);
      }, slow ? 1 : 5, slow ? 3 : 20);
      std::string fwd_path = cuda::attention_last_path();
      if (fwd_path == "mma") fwd_path = cuda::attention_mma_kernels();
      const double b = median_ms(state_, [&] {
        ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(s.Hq), int(s.Hkv), scale);
      }, slow ? 1 : 5, slow ? 3 : 20);
      std::string bwd_path = cuda::attention_last_path();
      if (bwd_path == "mma") bwd_path = cuda::attention_mma_kernels();
      if (!slow) {  // is this backward bitwise reproducible at this size?
        ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(s.Hq), int(s.Hkv), scale);
        const auto first = download_bytes(dqkv);
        ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(s.Hq), int(s.Hkv), scale);
        std::printf("  %s %s backward twice bitwise identical: %s\n", s.model, mode,
                    download_bytes(dqkv) == first ? "yes" : "no");
      }
      char row[256];
      std::snprintf(row, sizeof(row), "| %-13s | %2ld/%ld/%3ld | %-19s | %8.3f | %6.1f | %8.3f | %6.1f |",
                    s.model, long(s.Hq), long(s.Hkv), long(s.D), (fwd_path + "/" + bwd_path).c_str(), f,
                    fwd_flops / (f * 1e-3) / 1e12, b, 2.5 * fwd_flops / (b * 1e-3) / 1e12);
      rows.push_back(row);
      std::printf("%s\n", row);
    }
  }
  std::printf("\nattention perf on %s, B=%ld T=%ld, causal (fwd 2*2*B*Hq*T*T*D/2 FLOPs, bwd 2.5x):\n",
              cuda::device_name().c_str(), long(B), long(T));
  std::printf("| model         | Hq/Hkv/D   | path fwd/bwd        | fwd ms   | TFLOP/s| bwd ms   | TFLOP/s|\n");
  for (const auto& r : rows) std::printf("%s\n", r.c_str());
}

// Short sequences: where does cuDNN start to beat the CUDA-core and the tensor-core kernels? Same
// tokens per call (B*T = 16384) at each length; the demo model's heads (4/2/64) and Llama-3.2-1B's (32/8/64).
TEST_F(CudaAttention, PerfShortSequences) {
  if (!perf_mode()) GTEST_SKIP() << "set INGOT_CUDA_PERF=1 to run perf mode";
  struct Heads {
    const char* name;
    int64_t Hq, Hkv, D;
  };
  std::printf("short-sequence attention on %s, B*T = 16384 tokens, fwd + bwd ms (median of 15):\n",
              cuda::device_name().c_str());
  std::printf("| heads            | T    | kernels | tensor cores (%s) | cudnn  |\n",
              cuda::attention_wgmma_available(gpu, 64) ? "wgmma" : "mma.sync");
  for (const Heads& h : {Heads{"demo 4/2/64", 4, 2, 64}, Heads{"llama-1b 32/8/64", 32, 8, 64}}) {
    for (const int64_t T : {64, 128, 256, 512, 1024, 2048}) {
      const int64_t B = 16384 / T;
      const double scale = 1.0 / std::sqrt(double(h.D));
      const auto [qkv, dout, out, lse, dqkv] = random_problem(B, T, h.Hq, h.Hkv, h.D, 31);
      double ms[3];
      int i = 0;
      for (const char* mode : {"kernels", "mma", "cudnn"}) {
        ScopedMode scoped(std::strcmp(mode, "cudnn") == 0 ? nullptr : mode);
        ms[i++] = median_ms(state_, [&] {
          ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(h.Hq), int(h.Hkv), scale);
          ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(h.Hq), int(h.Hkv), scale);
        }, 3, 15);
      }
      std::printf("| %-16s | %4ld | %7.3f | %20.3f | %6.3f |\n", h.name, long(T), ms[0], ms[1], ms[2]);
    }
  }
}

// Packed rows (segment ids, as SFT data trains): cuDNN's fused engines accept no per-token
// document mask in this graph form (a segment-id comparison added to the causal mask finalizes no
// engine config, cuDNN 9.14), so they take Ingot's tensor-core kernels, which skip the tile pairs
// no document spans. Against the CUDA-core kernels on the same rows, and against whole-row causal
// attention (cuDNN, and the tensor-core kernels) over the same tokens: Llama-3.2-1B's heads,
// B x T = 4 x 4096, the loader's layout (documents of random length, the last tenth padding).
// "Useful" TFLOP/s counts only the (query, key) pairs that attend: 4 D Hq per pair forward, 2.5x
// that backward.
TEST_F(CudaAttention, PerfPackedRows) {
  if (!perf_mode()) GTEST_SKIP() << "set INGOT_CUDA_PERF=1 to run perf mode";
  const int64_t B = 4, T = 4096, Hq = 32, Hkv = 8, D = 64;
  const double scale = 1.0 / std::sqrt(double(D));
  const auto [qkv, dout, out, lse, dqkv] = random_problem(B, T, Hq, Hkv, D, 51);
  const std::vector<int32_t> ids = packed_rows(B, T, 52);
  Tensor seg = alloc(DType::i32, {B, T});
  cuda::copy_to_device(seg.data, ids.data(), seg.bytes(), state_);
  double packed_pairs = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0, run = 0; t < T; ++t) {
      run = t > 0 && ids[size_t(b * T + t)] == ids[size_t(b * T + t - 1)] ? run + 1 : 1;
      packed_pairs += double(run);
    }
  const double whole_pairs = double(B) * T * (T + 1) / 2;
  std::printf("packed attention on %s, %ld x %ld tokens, %ld/%ld/%ld heads; fwd + bwd (median of 5):\n",
              cuda::device_name().c_str(), long(B), long(T), long(Hq), long(Hkv), long(D));
  std::printf("| rows                          | ms       | useful TFLOP/s | backward path |\n");
  struct Run {
    const char* label;
    const char* mode;
    bool segments;
  };
  for (const Run& r : {Run{"packed (default)", nullptr, true}, Run{"packed, mma.sync kernels", "mma.sync", true},
                       Run{"packed, tensor cores alone", "mma", true}, Run{"packed, CUDA-core kernels", "kernels", true},
                       Run{"whole-row causal (default)", nullptr, false}, Run{"whole-row causal, mma", "mma", false},
                       Run{"whole-row causal, mma.sync", "mma.sync", false}}) {
    // "mma.sync": the run above it with the tensor-core kernels on mma.sync instead of wgmma (Hopper).
    const bool sync = r.mode && std::strcmp(r.mode, "mma.sync") == 0;
    if (sync && !cuda::attention_wgmma_available(gpu, int(D))) continue;
    ScopedMode scoped(sync ? (r.segments ? nullptr : "mma") : r.mode);
    ScopedMmaSync scoped_sync(sync);
    const Tensor segments = r.segments ? seg : Tensor{};
    const double ms = median_ms(state_, [&] {
      ops::attention_forward(gpu, out, lse, qkv, segments, int(Hq), int(Hkv), scale);
      ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, segments, int(Hq), int(Hkv), scale);
    }, 1, 5);
    const double flops = 3.5 * 4.0 * D * Hq * (r.segments ? packed_pairs : whole_pairs);
    std::string path = cuda::attention_last_path();  // the backward's
    if (path == "mma") path += std::string(" (") + cuda::attention_mma_kernels() + ")";
    std::printf("| %-29s | %8.3f | %14.1f | %s |\n", r.label, ms, flops / (ms * 1e-3) / 1e12, path.c_str());
  }
}

// Does cuDNN's deterministic backward pay for grouped kv heads? Llama-3.2-1B's attention at
// 4096 x 4 with its 8 kv heads against the same 32 query heads with 32 kv heads (MHA).
// The backward split into several cuDNN calls (BackwardSplitsToFitTheWorkspaceLimit) against one
// call and against the tensor-core kernels, at the lengths where the one call's workspace gets
// large: Llama-3.2-1B's heads (32/8/64) at 4 x 4096 (4 GiB) and 1 x 16384 (16 GiB), Llama-3-8B's
// (32/8/128) at 1 x 32768 (64 GiB). Backward ms, median of 5.
TEST_F(CudaAttention, PerfBackwardSplit) {
  if (!perf_mode()) GTEST_SKIP() << "set INGOT_CUDA_PERF=1 to run perf mode";
  if (!cuda::attention_cudnn_compiled()) GTEST_SKIP() << "built without cuDNN";
  struct RestoreLimit {
    ~RestoreLimit() { cuda::set_cudnn_backward_workspace_limit(std::numeric_limits<int64_t>::max()); }
  } restore;
  struct Shape {
    const char* heads;
    int64_t B, T, Hq, Hkv, D;
  };
  const Shape shapes[] = {{"Llama-3.2-1B", 4, 4096, 32, 8, 64},
                          {"Llama-3.2-1B", 1, 16384, 32, 8, 64},
                          {"Llama-3-8B", 1, 32768, 32, 8, 128}};
  std::printf("attention backward split on %s (ms, TFLOP/s causal):\n", cuda::device_name().c_str());
  std::printf("| heads        | B x T     | slice (rows x kv heads) | calls | workspace GiB | bwd ms  | TFLOP/s |\n");
  for (const Shape& s : shapes) {
    const double scale = 1.0 / std::sqrt(double(s.D));
    const auto [qkv, dout, out, lse, dqkv] = random_problem(s.B, s.T, s.Hq, s.Hkv, s.D, 81);
    ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(s.Hq), int(s.Hkv), scale);
    const double flops = 2.5 * 4.0 * s.B * s.Hq * double(s.T) * s.T * s.D / 2;
    std::vector<int64_t> limits;  // every split, largest first, then 0 (the tensor-core kernels)
    for (const cuda::CudnnBackwardSplit& split : cuda::cudnn_backward_splits(s.B, s.T, s.Hq, s.Hkv))
      limits.push_back(split.workspace_bytes(s.T, s.Hq, s.Hkv));
    limits.push_back(0);
    for (const int64_t limit : limits) {
      cuda::set_cudnn_backward_workspace_limit(limit);
      const double ms = median_ms(state_, [&] {
        ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(s.Hq), int(s.Hkv), scale);
      }, 2, 5);
      const std::string path = cuda::attention_last_path();
      const cuda::CudnnBackwardSplit split = cuda::cudnn_backward_split(s.B, s.T, s.Hq, s.Hkv, limit);
      char slice[64];
      if (split.fits())
        std::snprintf(slice, sizeof(slice), "%ld x %ld (%s)", long(split.rows), long(split.kv_heads), path.c_str());
      else
        std::snprintf(slice, sizeof(slice), "%s", (path == "mma" ? cuda::attention_mma_kernels() : path).c_str());
      std::printf("| %-12s | %ld x %-5ld | %-23s | %5ld | %13.2f | %7.2f | %7.1f |\n", s.heads, long(s.B), long(s.T),
                  slice, long(split.fits() ? split.calls(s.B, s.Hkv) : 0), double(limit) / (1 << 30), ms,
                  flops / (ms * 1e-3) / 1e12);
    }
  }
}

TEST_F(CudaAttention, PerfGroupedVsFullKvHeads) {
  if (!perf_mode()) GTEST_SKIP() << "set INGOT_CUDA_PERF=1 to run perf mode";
  const int64_t B = 4, T = 4096, Hq = 32, D = 64;
  std::printf("| Hq/Hkv/D  | variant       | fwd ms | bwd ms |\n");
  for (const int64_t Hkv : {8, 32}) {
    const double scale = 1.0 / std::sqrt(double(D));
    const auto [qkv, dout, out, lse, dqkv] = random_problem(B, T, Hq, Hkv, D, 41);
    for (const char* mode : {"cudnn", "cudnn-fast"}) {
      ScopedMode scoped(std::strcmp(mode, "cudnn") == 0 ? nullptr : mode);
      const double f = median_ms(state_, [&] { ops::attention_forward(gpu, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), scale); });
      const double b = median_ms(state_, [&] {
        ops::attention_backward(gpu, dqkv, dout, out, lse, qkv, Tensor{}, int(Hq), int(Hkv), scale);
      });
      std::printf("| %ld/%ld/%ld | %-13s | %6.2f | %6.2f |\n", long(Hq), long(Hkv), long(D), mode, f, b);
    }
  }
}

}  // namespace
}  // namespace ingot::test
