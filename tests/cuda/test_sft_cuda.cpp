// Chat SFT end to end on CUDA, through the CLI: `ingot prepare --format chat` with the repository's
// Llama-3-style BPE tokenizer fixture and its chat template, then a small Llama-shaped model trained
// on the packed, loss-masked shards. Its head dim is 64, so the dispatch sends attention over the
// packed rows (segment ids) to the tensor-core kernels (CudaAttention.DispatchPicksThePath). The
// bf16 GPU run must follow the fp32 CPU run's losses, and a second GPU run must repeat the first
// bit for bit (losses and saved weights).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "demo_runs.h"
#include "ingot/ops/cuda/device.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ingot;

namespace {

constexpr int kSteps = 30;

// Conversations of varied length (1 to 12 sentences in the answer), so that rows pack several
// documents with boundaries anywhere in a tile.
std::string chats_jsonl() {
  std::string jsonl;
  for (int i = 0; i < 300; ++i) {
    std::string answer = "It is " + std::to_string(2 * i) + ".";
    for (int k = 0; k < (i * 7) % 12; ++k)
      answer += " Adding " + std::to_string(i) + " to itself doubles it, step " + std::to_string(k) + ".";
    jsonl += "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " + std::to_string(i) + " plus " +
             std::to_string(i) + "?\"}, {\"role\": \"assistant\", \"content\": \"" + answer + "\"}]}\n";
  }
  return jsonl;
}

std::string config_yaml(const std::string& data, const std::string& out) {
  return "model_config:\n  model_type: llama\n  vocab_size: 1024\n  hidden_size: 256\n"
         "  intermediate_size: 512\n  num_hidden_layers: 2\n  num_attention_heads: 4\n"
         "  num_key_value_heads: 2\n  head_dim: 64\n  max_position_embeddings: 512\n"
         "  tie_word_embeddings: true\n"
         "train_data: " + data + "\nsequence_len: 256\nmicro_batch_size: 4\ngradient_accumulation_steps: 1\n"
         "max_steps: " + std::to_string(kSteps) + "\nlearning_rate: 3.0e-3\nwarmup_steps: 5\nweight_decay: 0.0\n"
         "output_dir: " + out + "\nlogging_steps: 1\neval_steps: 0\nsave_steps: " + std::to_string(kSteps) +
         "\nseed: 3\n";
}

TEST(CudaSft, PackedChatFollowsCpuAndRepeats) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const std::string tokenizer = test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer.json";
  const std::string root = test::temp_dir("CudaSft");
  {
    std::ofstream f(root + "/chats.jsonl");
    f << chats_jsonl();
  }
  std::string out;
  ASSERT_EQ(0, test::run_command(test::shell_quoted(test::binary_path()) + " prepare " +
                                     test::shell_quoted(root + "/chats.jsonl") + " --format chat --tokenizer " +
                                     test::shell_quoted(tokenizer) + " -o " + test::shell_quoted(root + "/data"),
                                 &out))
      << out;

  auto train = [&](const std::string& name, const std::string& options) {
    const std::string dir = root + "/" + name;
    {
      std::ofstream f(root + "/" + name + ".yaml");
      f << config_yaml(root + "/data", dir);
    }
    const std::string command = test::shell_quoted(test::binary_path()) + " train " +
                                test::shell_quoted(root + "/" + name + ".yaml") + options;
    std::string log;
    const int rc = test::run_command(command, &log);
    EXPECT_EQ(0, rc) << command << "\n" << log;
    EXPECT_NE(log.find("packed: "), std::string::npos) << "the masked shards should be packed:\n" << log;
    return test::losses(dir + "/metrics.jsonl");
  };
  const std::vector<double> cpu = train("cpu", " --set device=cpu --set precision=fp32");
  const std::vector<double> gpu = train("gpu", " --set device=cuda --set precision=bf16");
  const std::vector<double> again = train("gpu-again", " --set device=cuda --set precision=bf16");
  ASSERT_EQ(cpu.size(), size_t(kSteps));
  ASSERT_EQ(gpu.size(), size_t(kSteps));

  double mean_abs = 0;
  for (int s = kSteps - 10; s < kSteps; ++s) mean_abs += std::fabs(gpu[s] - cpu[s]) / 10;
  std::printf("  losses, step 1 / %d: cpu %.4f / %.4f, gpu %.4f / %.4f; mean |gpu - cpu| over the last 10: %.4f\n",
              kSteps, cpu[0], cpu[kSteps - 1], gpu[0], gpu[kSteps - 1], mean_abs);
  EXPECT_LT(cpu[kSteps - 1], cpu[0] - 1.0) << "the run should learn";
  EXPECT_LE(mean_abs, 0.03);
  EXPECT_EQ(gpu, again) << "two GPU runs differ";
  const std::string last = "/checkpoint-" + std::to_string(kSteps) + "/model.safetensors";
  EXPECT_TRUE(test::read_file(root + "/gpu" + last) == test::read_file(root + "/gpu-again" + last))
      << "two GPU runs saved different weights";
}

}  // namespace
