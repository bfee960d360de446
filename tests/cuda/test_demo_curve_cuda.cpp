// The demo model (examples/demo.yaml) trained 300 steps on real text, Debian's fortunes, by the CLI:
// once on the CPU reference in fp32 and twice on CUDA with the bf16 recipe. The two CUDA runs must
// end with bitwise-identical weights and optimizer state, and the CUDA loss curve must follow the
// CPU one (mean |difference| <= 0.02 nats over the last 100 steps).
//
// A 300-step run is chaotic: any perturbation grows. The same fp32 run built on two machines
// (other roundings) differs by ~0.013 on this measure, and bf16 runs land at 0.015-0.025 across
// seeds (docs/perf.md), so the 0.02 bound is close to the measure's own noise. One test holds the
// demo's own seed to it, as the issue states it; another holds the mean over six seeds, a steadier
// estimate of how far the bf16 recipe strays, and bounds every seed at 0.03.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ingot/ops/cuda/device.h"
#include "demo_runs.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ingot;

namespace {

constexpr int kSteps = 300;
constexpr int kTail = 100;
constexpr double kMaxMeanAbsDiff = 0.02;
constexpr double kMaxMeanAbsDiffAnySeed = 0.03;  // seeds 1..6 measured 0.015-0.025 on an H200
constexpr int kSeeds = 6;                         // the demo's seed (1) and seeds 2..6

struct CurveGap {
  double mean_abs = 0, mean_signed = 0;
};
// Mean |curve - reference| and mean signed difference over the last kTail steps.
CurveGap curve_gap(const std::vector<double>& curve, const std::vector<double>& reference) {
  CurveGap gap;
  for (int i = kSteps - kTail; i < kSteps; ++i) {
    gap.mean_abs += std::fabs(curve[i] - reference[i]) / kTail;
    gap.mean_signed += (curve[i] - reference[i]) / kTail;
  }
  return gap;
}

// The demo-seed runs (CPU fp32, CUDA bf16 twice), trained in SetUpTestSuite and shared by the tests
// below. ctest runs each test in its own process, so each trains them once; the across-seeds test
// trains its further seeds itself.
class CudaDemoCurve : public ::testing::Test {
 protected:
  struct Runs {
    std::string root, data, cpu, bf16, bf16_again;
    bool ok = false;
    std::string skip_reason;
  };
  static inline Runs* runs_ = nullptr;

  // The demo run for kSteps steps on `device` with `precision` (and more " --set" options) into
  // root/name; the directory, or empty when the run failed (its command and output are printed).
  static std::string train(const std::string& name, const std::string& device, const std::string& precision,
                           const std::string& options = "") {
    const std::string dir = runs_->root + "/" + name;
    std::string output;
    const int rc = test::train_demo(runs_->data, dir,
                                    " --set device=" + device + " --set precision=" + precision +
                                        " --set max_steps=" + std::to_string(kSteps) +
                                        " --set save_steps=" + std::to_string(kSteps) + options,
                                    &output);
    return rc == 0 ? dir : std::string();
  }

  static void SetUpTestSuite() {
    runs_ = new Runs();
    if (!cuda::device_available()) {
      runs_->skip_reason = "no CUDA device";
      return;
    }
    runs_->root = test::temp_dir("CudaDemoCurve");
    std::string error;
    const std::string data = test::demo_shards(runs_->root, &runs_->skip_reason, &error);
    if (data.empty()) {
      if (!error.empty()) std::printf("%s\n", error.c_str());
      return;  // skipped without text; a failed prepare leaves ok false: every test fails
    }
    runs_->data = data;
    runs_->cpu = train("cpu-fp32", "cpu", "fp32");
    runs_->bf16 = train("cuda-bf16", "cuda", "bf16");
    runs_->bf16_again = train("cuda-bf16-again", "cuda", "bf16");
    runs_->ok = !runs_->cpu.empty() && !runs_->bf16.empty() && !runs_->bf16_again.empty();
  }
  static void TearDownTestSuite() {
    // ~100 MB of checkpoints; kept when a run failed, for the post-mortem.
    if (runs_->ok && !::testing::UnitTest::GetInstance()->failed_test_count()) {
      std::error_code ignored;
      fs::remove_all(runs_->root, ignored);
    }
    delete runs_;
    runs_ = nullptr;
  }
  void SetUp() override {
    if (!runs_->skip_reason.empty()) INGOT_SKIP_OR_FAIL(runs_->skip_reason);
    ASSERT_TRUE(runs_->ok) << "a training run failed (its command and output are printed above)";
  }
};

}  // namespace

// Determinism, an engine invariant: the same bf16 run twice gives the same losses, weights and
// optimizer state, bit for bit.
TEST_F(CudaDemoCurve, Bf16RunRepeatsBitwise) {
  const std::vector<double> curve = test::losses(runs_->bf16 + "/metrics.jsonl");
  ASSERT_EQ(size_t(kSteps), curve.size());
  EXPECT_EQ(test::losses(runs_->bf16_again + "/metrics.jsonl"), curve);
  const std::string checkpoint = "/checkpoint-" + std::to_string(kSteps);
  for (const char* file : {"/model.safetensors", "/optimizer.safetensors"}) {
    const std::string a = test::read_file(runs_->bf16 + checkpoint + file);
    EXPECT_FALSE(a.empty()) << runs_->bf16 + checkpoint + file;
    EXPECT_TRUE(a == test::read_file(runs_->bf16_again + checkpoint + file)) << "the two bf16 runs differ in " << file;
  }
}

// The bound on the loss curve, at the demo's seed. This measured 0.0249 on an H200 and
// failed until the chunked embedding backward (6bfda3d) put the run on another path: 0.0167 since,
// a new draw of a chaotic measure (docs/perf.md: where the bf16 curve departs, and the spread over
// seeds), which any change of rounding can move again.
TEST_F(CudaDemoCurve, Bf16FollowsCpuReference) {
  const std::vector<double> reference = test::losses(runs_->cpu + "/metrics.jsonl");
  const std::vector<double> curve = test::losses(runs_->bf16 + "/metrics.jsonl");
  ASSERT_EQ(size_t(kSteps), reference.size());
  ASSERT_EQ(size_t(kSteps), curve.size());
  const CurveGap gap = curve_gap(curve, reference);
  std::printf("demo curve, cuda bf16 vs cpu fp32, steps %d-%d: mean |diff| %.4f (signed %+.4f); final %.4f / %.4f\n",
              kSteps - kTail + 1, kSteps, gap.mean_abs, gap.mean_signed, curve.back(), reference.back());
  EXPECT_LE(gap.mean_abs, kMaxMeanAbsDiff);
}

// The same measure over six seeds (the demo's and 2..6; each pair trained here, ~2 s on the GPU and
// ~8 s on the CPU reference): the mean within 0.02, every seed within 0.03.
TEST_F(CudaDemoCurve, Bf16FollowsCpuReferenceAcrossSeeds) {
  double sum = 0;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    std::string cpu = runs_->cpu, bf16 = runs_->bf16;
    if (seed > 1) {
      const std::string option = " --set seed=" + std::to_string(seed), tag = "-seed" + std::to_string(seed);
      cpu = train("cpu-fp32" + tag, "cpu", "fp32", option);
      bf16 = train("cuda-bf16" + tag, "cuda", "bf16", option);
      ASSERT_FALSE(cpu.empty() || bf16.empty()) << "seed " << seed << ": a training run failed (printed above)";
    }
    const std::vector<double> reference = test::losses(cpu + "/metrics.jsonl");
    const std::vector<double> curve = test::losses(bf16 + "/metrics.jsonl");
    ASSERT_EQ(size_t(kSteps), reference.size()) << "seed " << seed;
    ASSERT_EQ(size_t(kSteps), curve.size()) << "seed " << seed;
    const CurveGap gap = curve_gap(curve, reference);
    std::printf("seed %d: mean |diff| %.4f (signed %+.4f); final %.4f / %.4f\n", seed, gap.mean_abs,
                gap.mean_signed, curve.back(), reference.back());
    EXPECT_LE(gap.mean_abs, kMaxMeanAbsDiffAnySeed) << "seed " << seed;
    sum += gap.mean_abs;
  }
  std::printf("mean over %d seeds: %.4f\n", kSeeds, sum / kSeeds);
  EXPECT_LE(sum / kSeeds, kMaxMeanAbsDiff);
}
