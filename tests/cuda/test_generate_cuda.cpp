// `ingot generate --device cuda`, end to end through the CLI: the demo model trained briefly on CUDA
// (bf16 recipe) on real text, then sampled from its checkpoint on CUDA (bf16 compute copy of the
// saved f32 master weights) and on the CPU (f32). Greedy decoding and seeded sampling must each
// repeat themselves exactly on CUDA, and follow the CPU's text from the same checkpoint and seed for
// their first tokens: the sampler draws the same uniforms on both devices, so the texts part only
// where bf16 logits move a draw across a token boundary (or flip a greedy near tie).
// The greedy text is also checked token by token, past the point where the window slides: the CPU's
// f32 forward over each window CUDA saw must rank CUDA's pick first, up to a near tie. A text one
// token out of step with its windows must fail that check, so the check is shown to discriminate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "demo_runs.h"
#include "ingot/io/hf_model.h"
#include "ingot/io/json_util.h"
#include "ingot/model/config.h"
#include "ingot/model/transformer.h"
#include "ingot/ops/cuda/device.h"
#include "ingot/recipe/recipe.h"
#include "ingot/train/checkpoint.h"
#include "ingot/train/generate.h"
#include "ingot/train/trainer.h"
#include "test_util.h"

using namespace ingot;

namespace {

constexpr int kTrainSteps = 600;
constexpr int kNewTokens = 48;         // bytes: the demo model's tokens
constexpr size_t kMinAgree = 8;        // leading bytes in which CUDA's text must equal the CPU's
// How far below the CPU's largest logit CUDA's greedy pick may fall: bf16 compute moves the demo
// model's logits (of order 10) by a few hundredths; a pick from the wrong window misses by nats.
constexpr double kGreedyTieNats = 0.25;
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

// For each token of `continuation` (generated after kPrompt by the model of run_dir), how far its
// logit falls below the largest one in the CPU's f32 forward over the window generate fed the model
// for it: the last `context` tokens before it, at positions 0 up (generate.cpp). 0 where it is
// the CPU's argmax.
std::vector<double> greedy_shortfalls(const std::string& run_dir, const std::string& continuation) {
  const std::string dir = resolve_model_dir(run_dir);
  const ModelConfig config = load_model_config(dir);
  const auto tokenizer = load_tokenizer(dir, "");
  std::vector<int32_t> tokens = tokenizer->encode(kPrompt);
  const size_t prompt_tokens = tokens.size();
  const std::vector<int32_t> generated = tokenizer->encode(continuation);
  const int64_t context = std::min<int64_t>(config.max_position_embeddings,
                                            static_cast<int64_t>(prompt_tokens) + kNewTokens);
  DeviceContext device("cpu", 0);
  Context& ctx = device.get();
  Transformer model(config, make_recipe("fp32", ctx.device, {.master_weights = true}), ctx, 1, context, 1);
  io::load_hf_weights(ctx, dir, model.entries(), model.weights());
  std::vector<double> shortfalls;
  std::vector<int32_t> positions;
  for (const int32_t pick : generated) {
    const size_t begin = tokens.size() > static_cast<size_t>(context) ? tokens.size() - context : 0;
    std::vector<int32_t> window(tokens.begin() + static_cast<std::ptrdiff_t>(begin), tokens.end());
    positions.resize(window.size());
    std::iota(positions.begin(), positions.end(), 0);
    HostBatch batch;
    batch.input_ids = window.data();
    batch.positions = positions.data();
    model.load_batch(batch, static_cast<int64_t>(window.size()));
    const std::vector<double> logits = model.forward_logits_at(static_cast<int64_t>(window.size()) - 1);
    shortfalls.push_back(*std::max_element(logits.begin(), logits.end()) - logits.at(static_cast<size_t>(pick)));
    tokens.push_back(pick);
  }
  return shortfalls;
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
    if (mode != "--temperature 0") continue;

    // The generated tokens alone: the CLI ends the text with a newline of its own.
    ASSERT_FALSE(cuda_text.empty());
    ASSERT_EQ(cuda_text.back(), '\n');
    const std::string continuation = cuda_text.substr(0, cuda_text.size() - 1);
    const std::vector<double> shortfalls = greedy_shortfalls(run, continuation);
    // The demo's 64-byte window slides after 64 - 22 generated tokens: the check must reach past that.
    EXPECT_GT(shortfalls.size() + kPrompt.size(), 64u) << "the greedy text ended before the window slid: " << continuation;
    const auto worst = std::max_element(shortfalls.begin(), shortfalls.end());
    std::printf("greedy, teacher-forced on the CPU: %zu of %zu picks the CPU's argmax, worst shortfall %.4f nats at "
                "token %td\n",
                static_cast<size_t>(std::count(shortfalls.begin(), shortfalls.end(), 0.0)), shortfalls.size(), *worst,
                worst - shortfalls.begin());
    EXPECT_LE(*worst, kGreedyTieNats) << "token " << (worst - shortfalls.begin()) << " of " << continuation;
    // The same text one token late (its first byte dropped): each pick is then scored against the
    // window of the token after it, which a check that discriminates must reject somewhere.
    const std::vector<double> late = greedy_shortfalls(run, continuation.substr(1));
    const double late_worst = *std::max_element(late.begin(), late.end());
    std::printf("the same text one token late: worst shortfall %.4f nats\n", late_worst);
    EXPECT_GT(late_worst, kGreedyTieNats) << "the check passes a text out of step with its windows";
  }
}

// A head size the CUDA attention does not take is refused by key before any weight is read (the
// folder has none), where it used to fail at the first forward with a kernel's message.
TEST(CudaGenerate, RefusesAHeadDimTheKernelsDoNotTake) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const std::string dir = test::temp_dir("CudaGenerateHeadDim");
  io::write_file_atomically(dir + "/config.json", R"({"model_type": "qwen3", "vocab_size": 300, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 256, "max_position_embeddings": 64})");
  std::string out;
  EXPECT_NE(0, test::run_command(test::shell_quoted(test::binary_path()) + " generate " + test::shell_quoted(dir) +
                                     " --prompt hi --device cuda 2>&1",
                                 &out));
  EXPECT_NE(out.find("head_dim 256 (key \"head_dim\""), std::string::npos) << out;
  EXPECT_NE(out.find("use --device cpu"), std::string::npos) << out;
}
