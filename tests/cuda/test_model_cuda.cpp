// The whole model on CUDA against references:
//   - the Hugging Face float64 fixtures (tests/fixtures): logits, loss and every gradient in the
//     bf16 recipe; in the fp32 recipe also the weights after one AdamW step;
//   - packing: a packed row of two documents (segment ids) equals each document run alone;
//   - widths that are no multiple of 8 (vocabulary, hidden and MLP sizes, sequence length): the
//     CPU backend on the same random weights, fp32 at the fixtures' fp32 bounds and bf16 at theirs.
// Tolerances (norm-wise relative) against float64 HF: bf16 recipe (bf16 weights and activations,
// f32 gradients) logits and loss <= 2e-2, gradients <= 5e-2; fp32 recipe the CPU backend's fp32
// bounds, logits and loss <= 1e-5, gradients and updated weights <= 1e-4 (cuBLASLt computes in
// f32 without TF32, so only the summation order differs from the CPU). Packed vs separate on the
// same backend <= 2e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ingot/core/arena.h"
#include "ingot/io/hf_model.h"
#include "ingot/io/safetensors.h"
#include "ingot/model/transformer.h"
#include "ingot/ops/cuda/device.h"
#include "ingot/ops/ops.h"
#include "ingot/optim/adamw.h"
#include "cuda_test_util.h"
#include "fixture_util.h"
#include "test_util.h"

using namespace ingot;

namespace {

// A fixture's files (tests/fixtures/<arch>) and its batch.
struct Fixture {
  explicit Fixture(const std::string& arch)
      : dir(test::source_dir() + "/tests/fixtures/" + arch),
        config(load_model_config(dir)),
        expected(io::SafeTensorsReader::open(dir + "/expected.safetensors")),
        weights(io::SafeTensorsReader::open(dir + "/model.safetensors")),
        batch(test::fixture_batch(expected)) {}
  std::string dir;
  ModelConfig config;
  io::SafeTensorsReader expected, weights;
  test::FixtureBatch batch;
};

}  // namespace

class CudaHfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaHfFixture, MatchesTransformers) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const Fixture fixture(GetParam());
  const auto& [dir, config, expected, weights, f] = fixture;
  test::CudaContext cuda_ctx;
  Context& ctx = cuda_ctx.ctx;
  // The LM head and loss in one chunk, then in chunks of 5 tokens (5, 5, 5, 5 and 4 of the 24):
  // every real model's head runs in chunks (Llama 3: 3 x 4185 + 3829 tokens at 4 x 4096), where
  // each chunk accumulates its share of the head's weight gradient and the last one is shorter.
  for (const int64_t chunk_tokens : {int64_t{0}, int64_t{5}}) {
    SCOPED_TRACE("logits_chunk_tokens " + std::to_string(chunk_tokens));
    Transformer model(config, make_recipe("bf16", Device::cuda), ctx, f.B, f.T, chunk_tokens);
    io::load_hf_weights(ctx, dir, model.entries(), model.weights());
    model.load_batch({f.input_ids.data(), f.targets.data(), f.positions.data(), nullptr});
    const std::vector<double> logits = model.forward_logits();
    const double loss = model.forward_backward(1.0 / static_cast<double>(f.count)) / static_cast<double>(f.count);
    const std::vector<double> grads = to_host_doubles(ctx, model.grads());

    EXPECT_LE(test::relative_error(logits, test::read_fixture_doubles(expected, "logits")), 2e-2);
    const double ref_loss = test::read_fixture_doubles(expected, "loss")[0];
    EXPECT_LE(std::fabs(loss - ref_loss) / ref_loss, 2e-2) << loss << " vs " << ref_loss;
    for (const std::string& name : weights.names())
      EXPECT_LE(test::relative_error(test::hf_slice(model.entries(), grads, name),
                                     test::read_fixture_doubles(expected, "grad." + name)),
                5e-2)
          << "grad." << name;
  }
}

// The fp32 recipe on CUDA: f32 weights and activations throughout, attention on the CUDA-core
// kernels, so the CPU backend's fp32 bounds hold, and one AdamW step (the fixture's
// torch.optim.AdamW: decay on every parameter, no clipping) lands where HF's does.
TEST_P(CudaHfFixture, MatchesTransformersInFloat32) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const Fixture fixture(GetParam());
  const auto& [dir, config, expected, weights, f] = fixture;
  test::CudaContext cuda_ctx;
  Context& ctx = cuda_ctx.ctx;
  const Recipe recipe = make_recipe("fp32", Device::cuda);
  Transformer model(config, recipe, ctx, f.B, f.T);
  io::load_hf_weights(ctx, dir, model.entries(), model.weights());
  model.load_batch({f.input_ids.data(), f.targets.data(), f.positions.data(), nullptr});
  const std::vector<double> logits = model.forward_logits();
  const double loss = model.forward_backward(1.0 / static_cast<double>(f.count)) / static_cast<double>(f.count);
  const std::vector<double> grads = to_host_doubles(ctx, model.grads());

  AdamW optimizer(model.entries(), recipe, ctx, test::fixture_adamw(), model.weights());
  optimizer.step(model.weights(), model.grads(), 1e-2, 1);
  const std::vector<double> updated = to_host_doubles(ctx, model.weights());

  EXPECT_LE(test::relative_error(logits, test::read_fixture_doubles(expected, "logits")), 1e-5);
  const double ref_loss = test::read_fixture_doubles(expected, "loss")[0];
  EXPECT_LE(std::fabs(loss - ref_loss) / ref_loss, 1e-5) << loss << " vs " << ref_loss;
  int checked = 0;
  for (const std::string& name : weights.names()) {
    EXPECT_LE(test::relative_error(test::hf_slice(model.entries(), grads, name),
                                   test::read_fixture_doubles(expected, "grad." + name)),
              1e-4)
        << "grad." << name;
    EXPECT_LE(test::relative_error(test::hf_slice(model.entries(), updated, name),
                                   test::read_fixture_doubles(expected, "adamw." + name)),
              1e-4)
        << "adamw." << name;
    ++checked;
  }
  EXPECT_GT(checked, 15);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaHfFixture, ::testing::Values("llama", "qwen2", "qwen3"));

TEST(CudaPackingEquivalence, PackedRowEqualsDocumentsAlone) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const std::string dir = test::source_dir() + "/tests/fixtures/llama";
  const ModelConfig config = load_model_config(dir);
  const int64_t T = 24, len_a = 9, len_b = 11;  // two documents, then padding
  std::vector<int32_t> inputs(T, 0), targets(T, ops::kIgnoreIndex), positions(T, 0), segments(T, -1);
  uint64_t state = 7;
  for (int64_t t = 0; t < len_a + len_b; ++t) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    inputs[t] = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(config.vocab_size));
  }
  for (int64_t t = 0; t < len_a + len_b; ++t) {
    const bool in_a = t < len_a;
    const int64_t doc_end = in_a ? len_a : len_a + len_b;
    positions[t] = static_cast<int32_t>(in_a ? t : t - len_a);
    segments[t] = in_a ? 0 : 1;
    targets[t] = t + 1 < doc_end ? inputs[t + 1] : ops::kIgnoreIndex;  // never across documents
  }
  int64_t count = 0;
  for (int32_t t : targets) count += t != ops::kIgnoreIndex;
  const double scale = 1.0 / static_cast<double>(count);

  test::CudaContext cuda_ctx;
  Context& ctx = cuda_ctx.ctx;
  Transformer model(config, make_recipe("bf16", Device::cuda), ctx, 1, T);
  io::load_hf_weights(ctx, dir, model.entries(), model.weights());
  ops::zero(ctx, model.grads());
  model.load_batch({inputs.data(), targets.data(), positions.data(), segments.data()});
  const double packed_loss = model.forward_backward(scale);
  const std::vector<double> packed_grads = to_host_doubles(ctx, model.grads());

  ops::zero(ctx, model.grads());
  double separate_loss = 0;
  for (auto [begin, len] : {std::pair<int64_t, int64_t>{0, len_a}, {len_a, len_b}}) {
    std::vector<int32_t> in(inputs.begin() + begin, inputs.begin() + begin + len);
    std::vector<int32_t> tg(targets.begin() + begin, targets.begin() + begin + len);
    std::vector<int32_t> pos(len);
    std::iota(pos.begin(), pos.end(), 0);
    model.load_batch({in.data(), tg.data(), pos.data(), nullptr}, len);
    separate_loss += model.forward_backward(scale);
  }
  const std::vector<double> separate_grads = to_host_doubles(ctx, model.grads());
  EXPECT_LE(std::fabs(packed_loss - separate_loss) / separate_loss, 2e-2) << packed_loss << " vs " << separate_loss;
  EXPECT_LE(test::relative_error(packed_grads, separate_grads), 2e-2);
}

namespace {

// Shapes the presets never take: every width but the heads' no multiple of 8, so GEMM leading
// dimensions and LM-head chunk offsets are 2- to 8-byte aligned and the elementwise kernels take
// their scalar paths. llama: head_dim 20 (the CUDA-core attention kernels), untied; qwen3: head
// dim 32 (cuDNN), qk-norm, tied.
ModelConfig odd_widths(const std::string& model_type) {
  const std::string heads = model_type == "llama" ? R"("num_attention_heads": 5, "num_key_value_heads": 1)"
                                                  : R"("num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32)";
  return parse_model_config(R"({"model_type": ")" + model_type + R"(", "vocab_size": 301, "hidden_size": 100,
    "intermediate_size": 270, "num_hidden_layers": 2, )" + heads + R"(, "max_position_embeddings": 64,
    "tie_word_embeddings": )" + (model_type == "llama" ? "false" : "true") + "}",
                            "odd-width test config");
}

struct ModelOutputs {
  std::vector<double> logits, grads;
  double loss = 0;
};

// Logits, then the mean loss and its gradient, for weights given as doubles in the flat layout.
ModelOutputs run_model(Context& ctx, const ModelConfig& config, const Recipe& recipe, const std::vector<double>& weights,
                       int64_t chunk_tokens, const test::FixtureBatch& f) {
  Transformer model(config, recipe, ctx, f.B, f.T, chunk_tokens);
  const std::vector<float> values(weights.begin(), weights.end());
  if (model.weights().dtype == DType::f32) {
    copy_from_host(ctx, model.weights(), values.data());
  } else {
    std::vector<uint16_t> bits(values.size());
    std::transform(values.begin(), values.end(), bits.begin(), f32_to_bf16);
    copy_from_host(ctx, model.weights(), bits.data());
  }
  ops::zero(ctx, model.grads());
  model.load_batch({f.input_ids.data(), f.targets.data(), f.positions.data(), nullptr});
  ModelOutputs out;
  out.logits = model.forward_logits();
  out.loss = model.forward_backward(1.0 / static_cast<double>(f.count)) / static_cast<double>(f.count);
  out.grads = to_host_doubles(ctx, model.grads());
  return out;
}

}  // namespace

class CudaOddWidths : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaOddWidths, MatchTheCpu) {
  if (!cuda::device_available()) INGOT_SKIP_OR_FAIL("no CUDA device");
  const ModelConfig config = odd_widths(GetParam());
  // Two rows of 37 tokens, random ids, the targets the next ids with a few left out.
  test::FixtureBatch f;
  f.B = 2;
  f.T = 37;
  uint64_t state = test::test_seed(11);
  for (int64_t b = 0; b < f.B; ++b) {
    std::vector<int32_t> row(static_cast<size_t>(f.T + 1));
    for (int32_t& id : row) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      id = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(config.vocab_size));
    }
    for (int64_t t = 0; t < f.T; ++t) {
      f.input_ids.push_back(row[t]);
      f.targets.push_back(t % 9 == 4 ? ops::kIgnoreIndex : row[t + 1]);
      f.positions.push_back(static_cast<int32_t>(t));
    }
  }
  f.count = std::count_if(f.targets.begin(), f.targets.end(), [](int32_t t) { return t != ops::kIgnoreIndex; });

  Context cpu;
  cpu.num_threads = 2;
  test::CudaContext cuda_ctx;
  // The same random weights everywhere (drawn by the CPU model, in f32).
  Transformer init(config, make_recipe("fp32", Device::cpu), cpu, 1, 1);
  init.init_random(test::test_seed(3));
  const std::vector<double> weights = to_host_doubles(cpu, init.weights());
  // bf16: the CPU computes with the weights CUDA holds, rounded to bf16.
  std::vector<double> rounded(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) rounded[i] = bf16_to_f32(f32_to_bf16(static_cast<float>(weights[i])));

  for (const int64_t chunk_tokens : {int64_t{0}, int64_t{5}}) {  // chunks of 5 rows start 1000 bytes apart
    SCOPED_TRACE("logits_chunk_tokens " + std::to_string(chunk_tokens));
    const ModelOutputs reference = run_model(cpu, config, make_recipe("fp32", Device::cpu), weights, chunk_tokens, f);
    const ModelOutputs fp32 = run_model(cuda_ctx.ctx, config, make_recipe("fp32", Device::cuda), weights, chunk_tokens, f);
    EXPECT_LE(test::relative_error(fp32.logits, reference.logits), 1e-5);
    EXPECT_LE(std::fabs(fp32.loss - reference.loss) / reference.loss, 1e-5) << fp32.loss << " vs " << reference.loss;
    EXPECT_LE(test::relative_error(fp32.grads, reference.grads), 1e-4);

    const ModelOutputs reference_rounded = run_model(cpu, config, make_recipe("fp32", Device::cpu), rounded, chunk_tokens, f);
    const ModelOutputs bf16 = run_model(cuda_ctx.ctx, config, make_recipe("bf16", Device::cuda), weights, chunk_tokens, f);
    EXPECT_LE(test::relative_error(bf16.logits, reference_rounded.logits), 2e-2);
    EXPECT_LE(std::fabs(bf16.loss - reference_rounded.loss) / reference_rounded.loss, 2e-2);
    EXPECT_LE(test::relative_error(bf16.grads, reference_rounded.grads), 5e-2);
    std::printf("%s, chunk %lld: fp32 logits %.2e grads %.2e | bf16 logits %.2e grads %.2e (norm-wise relative)\n",
                GetParam().c_str(), static_cast<long long>(chunk_tokens),
                test::relative_error(fp32.logits, reference.logits), test::relative_error(fp32.grads, reference.grads),
                test::relative_error(bf16.logits, reference_rounded.logits),
                test::relative_error(bf16.grads, reference_rounded.grads));
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaOddWidths, ::testing::Values("llama", "qwen3"));
