// The demo model (examples/demo.yaml) trained 300 steps on real text, Debian's fortunes, by the CLI:
// once on the CPU reference in fp32 and twice on CUDA with the bf16 recipe. The CUDA loss curve must
// follow the CPU one (mean |difference| <= 0.02 nats over the last 100 steps) and the two CUDA runs
// must end with bitwise-identical weights and optimizer state.
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

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

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

// Fortunes shards: prepared here from the Debian package (`make deps` installs it), or the ones a
// device run carries in runs/demo-data. Empty when neither exists.
std::string demo_data(const std::string& root) {
  const std::string corpus = "/usr/share/games/fortunes";
  if (fs::exists(corpus)) {
    std::string output;
    const std::string data = root + "/data";
    const int rc = test::run_command(test::binary_path() + " prepare " + corpus + " --doc-separator % -o " + data, &output);
    EXPECT_EQ(0, rc) << output;
    return rc == 0 ? data : "";
  }
  const std::string carried = test::source_dir() + "/runs/demo-data";
  return fs::exists(carried + "/meta.json") ? carried : "";
}

}  // namespace

TEST(CudaDemoCurve, Bf16FollowsCpuReferenceAndRepeatsBitwise) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  const std::string root = test::temp_dir("CudaDemoCurve");
  const std::string data = demo_data(root);
  if (data.empty()) GTEST_SKIP() << "no fortunes text: install the `fortunes` package (make deps)";

  auto train = [&](const std::string& name, const std::string& device, const std::string& precision) {
    const std::string dir = root + "/" + name;
    std::string output;
    const std::string command = test::binary_path() + " train " + test::source_dir() + "/examples/demo.yaml" +
                                " --set train_data=" + data + " --set output_dir=" + dir + " --set device=" + device +
                                " --set precision=" + precision + " --set max_steps=" + std::to_string(kSteps) +
                                " --set logging_steps=1 --set eval_steps=0 --set save_steps=" + std::to_string(kSteps);
    EXPECT_EQ(0, test::run_command(command, &output)) << command << "\n" << output;
    return dir;
  };
  const std::string cpu = train("cpu-fp32", "cpu", "fp32");
  const std::string bf16 = train("cuda-bf16", "cuda", "bf16");
  const std::string again = train("cuda-bf16-again", "cuda", "bf16");

  const std::vector<double> reference = losses(cpu + "/metrics.jsonl");
  const std::vector<double> curve = losses(bf16 + "/metrics.jsonl");
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

  const std::string checkpoint = "/checkpoint-" + std::to_string(kSteps);
  EXPECT_EQ(losses(again + "/metrics.jsonl"), curve);
  for (const char* file : {"/model.safetensors", "/optimizer.safetensors"}) {
    const std::string a = read_file(bf16 + checkpoint + file);
    EXPECT_FALSE(a.empty()) << bf16 + checkpoint + file;
    EXPECT_TRUE(a == read_file(again + checkpoint + file)) << "the two bf16 runs differ in " << file;
  }
}
