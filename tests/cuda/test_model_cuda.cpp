// The whole model on CUDA against references:
//   - the Hugging Face float64 fixtures (tests/fixtures): logits, loss and every gradient in the
//     bf16 recipe; in the fp32 recipe also the weights after one AdamW step;
//   - packing: a packed row of two documents (segment ids) equals each document run alone.
// Tolerances (norm-wise relative) against float64 HF: bf16 recipe (bf16 weights and activations,
// f32 gradients) logits and loss <= 2e-2, gradients <= 5e-2; fp32 recipe the CPU backend's fp32
// bounds, logits and loss <= 1e-5, gradients and updated weights <= 1e-4 (cuBLASLt computes in
// f32 without TF32, so only the summation order differs from the CPU). Packed vs separate on the
// same backend <= 2e-2.
#include <gtest/gtest.h>

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
