// The demo model (examples/demo.yaml) trained 300 steps on real text, Debian's fortunes, by the CLI:
// once on the CPU reference in fp32 and twice on CUDA with the bf16 recipe. The two CUDA runs must
// end with bitwise-identical weights and optimizer state, and the CUDA loss curve must follow the
// CPU one (mean |difference| <= 0.02 nats over the last 100 steps).
//
// A 300-step run is chaotic: any perturbation grows. The same fp32 run built on two machines
// (other roundings) differs by ~0.013 on this measure, and bf16 runs land at 0.017-0.025 across
// seeds (docs/perf.md), so the 0.02 bound is close to the measure's own noise; the test uses the
// demo's seed, as `make demo` does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ingot/ops/cuda/device.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ingot;

namespace {

constexpr int kSteps = 300;
constexpr int kTail = 100;
constexpr double kMaxMeanAbsDiff = 0.02;

// The "loss" of every line of metrics.jsonl (one line a step with logging_steps: 1).
std::vector<double> losses(const std::string& metrics_path) {
  std::ifstream f(metrics_path);
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line)) {
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 7)));
  }
  return out;
}

// Quoted for the shell: paths may hold spaces.
std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Where the fortunes shards come from: the Debian package's text (`make deps` installs it),
// prepared by the test, or the shards a device run carries in runs/demo-data. Empty when neither
// exists.
struct DemoText {
  std::string corpus, carried_shards;
};
DemoText find_demo_text() {
  DemoText t;
  if (fs::exists("/usr/share/games/fortunes")) t.corpus = "/usr/share/games/fortunes";
  else if (fs::exists(test::source_dir() + "/runs/demo-data/meta.json")) t.carried_shards = test::source_dir() + "/runs/demo-data";
  return t;
}

// The three runs, trained once per process and shared by the two tests below.
class CudaDemoCurve : public ::testing::Test {
 protected:
  struct Runs {
    std::string root, cpu, bf16, bf16_again;
    bool ok = false;
    std::string skip_reason;
  };
  static inline Runs* runs_ = nullptr;

  static void SetUpTestSuite() {
    runs_ = new Runs();
    if (!cuda::device_available()) {
      runs_->skip_reason = "no CUDA device";
      return;
    }
    const DemoText text = find_demo_text();
    if (text.corpus.empty() && text.carried_shards.empty()) {
      runs_->skip_reason = "no fortunes text: install the `fortunes` package (make deps)";
      return;
    }
    runs_->root = test::temp_dir("CudaDemoCurve");
    std::string data = text.carried_shards;
    if (!text.corpus.empty()) {
      data = runs_->root + "/data";
      std::string output;
      const int rc = test::run_command(shell_quoted(test::binary_path()) + " prepare " + shell_quoted(text.corpus) +
                                           " --doc-separator % -o " + shell_quoted(data), &output);
      if (rc != 0) {
        std::printf("ingot prepare failed (exit %d):\n%s\n", rc, output.c_str());
        return;  // ok stays false: both tests fail
      }
    }
    auto train = [&](const std::string& name, const std::string& device, const std::string& precision) {
      const std::string dir = runs_->root + "/" + name;
      std::string output;
      const std::string command = shell_quoted(test::binary_path()) + " train " +
                                  shell_quoted(test::source_dir() + "/examples/demo.yaml") + " --set train_data=" +
                                  shell_quoted(data) + " --set output_dir=" + shell_quoted(dir) + " --set device=" + device +
                                  " --set precision=" + precision + " --set max_steps=" + std::to_string(kSteps) +
                                  " --set logging_steps=1 --set eval_steps=0 --set save_steps=" +
                                  std::to_string(kSteps);
      const int rc = test::run_command(command, &output);
      if (rc != 0) std::printf("%s\nexit %d:\n%s\n", command.c_str(), rc, output.c_str());
      return rc == 0 ? dir : std::string();
    };
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
    if (!runs_->skip_reason.empty()) GTEST_SKIP() << runs_->skip_reason;
    ASSERT_TRUE(runs_->ok) << "a training run failed (its command and output are printed above)";
  }
};

}  // namespace

// Determinism, an engine invariant: the same bf16 run twice gives the same losses, weights and
// optimizer state, bit for bit.
TEST_F(CudaDemoCurve, Bf16RunRepeatsBitwise) {
  const std::vector<double> curve = losses(runs_->bf16 + "/metrics.jsonl");
  ASSERT_EQ(size_t(kSteps), curve.size());
  EXPECT_EQ(losses(runs_->bf16_again + "/metrics.jsonl"), curve);
  const std::string checkpoint = "/checkpoint-" + std::to_string(kSteps);
  for (const char* file : {"/model.safetensors", "/optimizer.safetensors"}) {
    const std::string a = test::read_file(runs_->bf16 + checkpoint + file);
    EXPECT_FALSE(a.empty()) << runs_->bf16 + checkpoint + file;
    EXPECT_TRUE(a == test::read_file(runs_->bf16_again + checkpoint + file)) << "the two bf16 runs differ in " << file;
  }
}

// The bound on the loss curve. At the demo's seed this measures 0.0249 on an H200 and
// fails (docs/perf.md: where the bf16 curve departs, and the spread over seeds).
TEST_F(CudaDemoCurve, Bf16FollowsCpuReference) {
  const std::vector<double> reference = losses(runs_->cpu + "/metrics.jsonl");
  const std::vector<double> curve = losses(runs_->bf16 + "/metrics.jsonl");
  ASSERT_EQ(size_t(kSteps), reference.size());
  ASSERT_EQ(size_t(kSteps), curve.size());
  double sum_abs = 0, sum_signed = 0;
  for (int i = kSteps - kTail; i < kSteps; ++i) {
    sum_abs += std::fabs(curve[i] - reference[i]);
    sum_signed += curve[i] - reference[i];
  }
  const double mean_abs = sum_abs / kTail;
  std::printf("demo curve, cuda bf16 vs cpu fp32, steps %d-%d: mean |diff| %.4f (signed %+.4f); final %.4f / %.4f\n",
              kSteps - kTail + 1, kSteps, mean_abs, sum_signed / kTail, curve.back(), reference.back());
  EXPECT_LE(mean_abs, kMaxMeanAbsDiff);
}
