// `ingot generate --device cuda`, end to end through the CLI: the demo model trained briefly on CUDA
// (bf16 recipe) on real text, then sampled from its checkpoint on CUDA (bf16 compute copy of the
// saved f32 master weights) and on the CPU (f32). Greedy decoding and seeded sampling must each
// repeat themselves exactly on CUDA, and follow the CPU's text from the same checkpoint and seed for
// their first tokens: the sampler draws the same uniforms on both devices, so the texts part only
// where bf16 logits move a draw across a token boundary (or flip a greedy near tie). Greedy text of
// a small model soon loops; the sampled text is the sharper check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "demo_runs.h"
#include "ingot/ops/cuda/device.h"
#include "test_util.h"

using namespace ingot;

namespace {

constexpr int kTrainSteps = 600;
constexpr int kNewTokens = 48;         // bytes: the demo model's tokens
constexpr size_t kMinAgree = 8;        // leading bytes in which CUDA's text must equal the CPU's
const std::string kPrompt = "The meaning of life is";

// `ingot generate` on model_dir; the command's exit status, its standard output in *text (and,
// when it fails, its standard error after it). Standard error is kept apart: it may carry a note,
// such as the window sliding past max_position_embeddings, which is no part of the text.
int generate(const std::string& model_dir, const std::string& flags, std::string* text) {
  const std::string err = model_dir + "/../generate.err";
  const int rc = test::run_command("{ " + test::shell_quoted(test::binary_path()) + " generate " +
                                       test::shell_quoted(model_dir) + " --prompt " + test::shell_quoted(kPrompt) +
                                       " --max-new-tokens " + std::to_string(kNewTokens) + " " + flags + " 2>" +
                                       test::shell_quoted(err) + "; }",
                                   text);
  if (rc != 0) *text += test::read_file(err);
  return rc;
}

}  // namespace

TEST(CudaGenerate, GreedyFollowsTheCpuAndSamplingRepeats) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const std::string root = test::temp_dir("CudaGenerate");
  std::string skip, error, out;
  const std::string data = test::demo_shards(root, &skip, &error);
  if (!skip.empty()) INGOT_SKIP_OR_FAIL(skip);
  ASSERT_FALSE(data.empty()) << error;
  const std::string run = root + "/run";
  ASSERT_EQ(0, test::train_demo(data, run, " --set device=cuda --set precision=bf16 --set max_steps=" +
                                             std::to_string(kTrainSteps), &out));

  for (const std::string mode : {"--temperature 0", "--temperature 0.8 --top-k 40 --seed 5"}) {
    std::string cuda, cuda_again, cpu;
    ASSERT_EQ(0, generate(run, "--device cuda " + mode, &cuda)) << cuda;
    ASSERT_EQ(0, generate(run, "--device cuda " + mode, &cuda_again)) << cuda_again;
    ASSERT_EQ(0, generate(run, "--device cpu " + mode, &cpu)) << cpu;
    EXPECT_EQ(cuda, cuda_again) << mode;
    ASSERT_EQ(cuda.rfind(kPrompt, 0), 0u) << cuda;
    ASSERT_EQ(cpu.rfind(kPrompt, 0), 0u) << cpu;
    const std::string cuda_text = cuda.substr(kPrompt.size()), cpu_text = cpu.substr(kPrompt.size());
    const size_t agree =
        std::mismatch(cuda_text.begin(), cuda_text.end(), cpu_text.begin(), cpu_text.end()).first - cuda_text.begin();
    std::printf("%s: %zu of %zu bytes equal before the first difference\n  cuda: %s  cpu:  %s", mode.c_str(), agree,
                cuda_text.size(), cuda_text.c_str(), cpu_text.c_str());
    EXPECT_GT(cuda_text.size(), kMinAgree) << mode;
    EXPECT_GE(agree, kMinAgree) << mode << "\nCUDA: " << cuda_text << "\nCPU:  " << cpu_text;
  }
}
