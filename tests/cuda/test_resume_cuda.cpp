// Resume on CUDA, end to end through the CLI on the demo model and real text: a run stopped at a
// checkpoint and resumed must repeat the uninterrupted run bit for bit (losses, weights, optimizer
// state), with the default bf16 recipe (f32 master weights saved, bf16 compute copy rebuilt from
// them) and with the peers' recipe (bf16 weights, gradients and AdamW moments saved as they are),
// also with stochastic rounding.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>

#include "demo_runs.h"
#include "ingot/ops/cuda/device.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ingot;

namespace {

struct ResumeCase {
  const char* name;
  const char* options;      // --set arguments of the recipe
  const char* saved_dtype;  // safetensors dtype of the saved weights and moments
};

void PrintTo(const ResumeCase& c, std::ostream* os) { *os << c.name; }

class CudaResume : public ::testing::TestWithParam<ResumeCase> {};

constexpr int kSteps = 24, kMid = 12;

TEST_P(CudaResume, RepeatsTheUninterruptedRunBitForBit) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const ResumeCase& c = GetParam();
  const std::string root = test::temp_dir(std::string("CudaResume_") + c.name);
  std::string skip, error, out;
  const std::string data = test::demo_shards(root, &skip, &error);
  if (!skip.empty()) INGOT_SKIP_OR_FAIL(skip);
  ASSERT_FALSE(data.empty()) << error;
  const std::string recipe = std::string(" --set device=cuda --set precision=bf16 --set max_steps=") +
                             std::to_string(kSteps) + " " + c.options;
  ASSERT_EQ(0, test::train_demo(data, root + "/straight", recipe, &out));
  // Saves at kMid and kSteps; the second leg starts from checkpoint-kMid.
  const std::string mid = root + "/mid", save = " --set save_steps=" + std::to_string(kMid);
  ASSERT_EQ(0, test::train_demo(data, mid, recipe + save, &out));
  fs::remove_all(mid + "/checkpoint-" + std::to_string(kSteps));
  ASSERT_EQ(0, test::train_demo(data, mid, recipe + save + " --resume", &out));
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;

  const std::vector<double> straight = test::losses(root + "/straight/metrics.jsonl");
  ASSERT_EQ(straight.size(), size_t(kSteps));
  EXPECT_EQ(test::losses(mid + "/metrics.jsonl"), straight);
  const std::string last = "/checkpoint-" + std::to_string(kSteps);
  for (const char* file : {"/model.safetensors", "/optimizer.safetensors"}) {
    const std::string a = test::read_file(root + "/straight" + last + file);
    ASSERT_FALSE(a.empty()) << root + "/straight" + last + file;
    // The header names each tensor's dtype: the recipe took effect.
    EXPECT_NE(a.substr(0, 4096).find(std::string("\"dtype\":\"") + c.saved_dtype + "\""), std::string::npos)
        << file << " should hold " << c.saved_dtype << " tensors";
    EXPECT_TRUE(a == test::read_file(mid + last + file)) << "resumed run differs in " << file;
  }
  std::error_code ignored;
  if (!HasFailure()) fs::remove_all(root, ignored);
}

// SIGTERM in the middle of a CUDA run, where two steps are in flight when it lands: the run
// finishes them, saves at the last, exits 143, and --resume ends with the uninterrupted run's bits.
TEST(CudaStopSignal, ResumedRunRepeatsTheUninterruptedRunBitForBit) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const std::string root = test::temp_dir("CudaStopSignal");
  std::string skip, error, out;
  const std::string data = test::demo_shards(root, &skip, &error);
  if (!skip.empty()) INGOT_SKIP_OR_FAIL(skip);
  ASSERT_FALSE(data.empty()) << error;
  constexpr int kDemoSteps = 1200;  // examples/demo.yaml's max_steps: ~6 s here, the signal lands near step 100
  const std::string options = " --set device=cuda --set precision=bf16";
  ASSERT_EQ(0, test::train_demo(data, root + "/straight", options, &out));

  // train_demo's command line, run in the background and signalled once step 100 is logged.
  const std::string command = test::shell_quoted(test::binary_path()) + " train " +
                              test::shell_quoted(test::source_dir() + "/examples/demo.yaml") + " --set train_data=" +
                              test::shell_quoted(data) + " --set output_dir=" + test::shell_quoted(root + "/stopped") +
                              " --set logging_steps=1 --set eval_steps=0" + options;
  const std::string log = root + "/stopped.log";
  const std::string script = command + " >" + test::shell_quoted(log) + " 2>&1 &\npid=$!\n"
                             "for i in $(seq 3000); do grep -q '^step 100/' " + test::shell_quoted(log) +
                             " && break; sleep 0.02; done\nkill -TERM $pid\n"
                             "for i in $(seq 3000); do kill -0 $pid 2>/dev/null || break; sleep 0.02; done\n"
                             "kill -KILL $pid 2>/dev/null\nwait $pid\n";
  std::ofstream(root + "/stop.sh") << script;
  const int rc = test::run_command("bash " + test::shell_quoted(root + "/stop.sh"), &out);
  const std::string text = test::read_file(log);
  EXPECT_EQ(rc, 128 + 15) << out << text;
  const size_t at = text.find("stopped by SIGTERM after step ");
  ASSERT_NE(at, std::string::npos) << text;
  const int step = std::stoi(text.substr(at + 30));
  ASSERT_TRUE(step >= 100 && step < kDemoSteps) << text;
  EXPECT_TRUE(fs::exists(root + "/stopped/checkpoint-" + std::to_string(step))) << text;

  ASSERT_EQ(0, test::train_demo(data, root + "/stopped", options + " --resume", &out));
  EXPECT_NE(out.find("resumed from " + root + "/stopped/checkpoint-" + std::to_string(step)), std::string::npos) << out;
  EXPECT_EQ(test::losses(root + "/stopped/metrics.jsonl"), test::losses(root + "/straight/metrics.jsonl"));
  const std::string last = "/checkpoint-" + std::to_string(kDemoSteps);
  for (const char* file : {"/model.safetensors", "/optimizer.safetensors"}) {
    const std::string a = test::read_file(root + "/straight" + last + file);
    ASSERT_FALSE(a.empty()) << root + "/straight" + last + file;
    EXPECT_TRUE(a == test::read_file(root + "/stopped" + last + file)) << "resumed run differs in " << file;
  }
  std::error_code ignored;
  if (!::testing::Test::HasFailure()) fs::remove_all(root, ignored);
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, CudaResume,
    ::testing::Values(ResumeCase{"default", "", "F32"},
                      ResumeCase{"peers", "--set master_weights=false --set grad_dtype=bf16 --set optimizer_state_dtype=bf16",
                                 "BF16"},
                      // The rounding draws follow the update number across the resume.
                      ResumeCase{"peers_stochastic_rounding",
                                 "--set master_weights=false --set grad_dtype=bf16 --set optimizer_state_dtype=bf16 "
                                 "--set stochastic_rounding=true",
                                 "BF16"}),
    [](const ::testing::TestParamInfo<ResumeCase>& info) { return std::string(info.param.name); });

}  // namespace
