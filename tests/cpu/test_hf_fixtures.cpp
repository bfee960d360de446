// The CPU backend against Hugging Face transformers (tests/fixtures, made by
// tools/make_hf_fixtures.py in float64): logits, loss, every parameter gradient and the weights
// after one AdamW step, for llama (llama3 RoPE, untied), qwen2 (biases, tied), qwen3 (qk-norm,
// head_dim != hidden/heads, tied).
// Tolerances (norm-wise relative): float64 <= 1e-10 everywhere; float32 <= 1e-5 for logits and
// loss, <= 1e-4 for gradients and updated weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "ingot/core/error.h"
#include "ingot/io/hf_model.h"
#include "ingot/io/safetensors.h"
#include "ingot/model/transformer.h"
#include "ingot/ops/ops.h"
#include "ingot/optim/adamw.h"
#include "fixture_util.h"
#include "test_util.h"

using namespace ingot;
namespace fs = std::filesystem;

namespace {

std::string fixture_dir(const std::string& arch) { return test::source_dir() + "/tests/fixtures/" + arch; }

struct FixtureRun {
  double loss = 0;
  std::vector<double> logits, grads, updated;
  std::vector<ParamEntry> entries;
};

FixtureRun run_fixture(const std::string& arch, const std::string& precision) {
  const std::string dir = fixture_dir(arch);
  const ModelConfig config = load_model_config(dir);
  const io::SafeTensorsReader expected = io::SafeTensorsReader::open(dir + "/expected.safetensors");
  const test::FixtureBatch f = test::fixture_batch(expected);

  Context ctx;
  ctx.num_threads = 2;
  const Recipe recipe = make_recipe(precision, Device::cpu);
  Transformer model(config, recipe, ctx, f.B, f.T);
  io::load_hf_weights(ctx, dir, model.entries(), model.weights());
  HostBatch batch{f.input_ids.data(), f.targets.data(), f.positions.data(), nullptr};
  model.load_batch(batch);

  FixtureRun run;
  run.entries = model.entries();
  run.logits = model.forward_logits();
  run.loss = model.forward_backward(1.0 / static_cast<double>(f.count)) / static_cast<double>(f.count);
  run.grads = to_host_doubles(ctx, model.grads());

  const AdamWConfig adam = test::fixture_adamw();
  AdamW optimizer(model.entries(), recipe, ctx, adam, model.weights());
  optimizer.step(model.weights(), model.grads(), 1e-2, 1);
  run.updated = to_host_doubles(ctx, model.weights());
  return run;
}

void check_fixture(const std::string& arch, const std::string& precision, double logits_tol, double grad_tol) {
  const std::string dir = fixture_dir(arch);
  const FixtureRun run = run_fixture(arch, precision);
  const io::SafeTensorsReader expected = io::SafeTensorsReader::open(dir + "/expected.safetensors");
  const io::SafeTensorsReader weights = io::SafeTensorsReader::open(dir + "/model.safetensors");

  EXPECT_LE(test::relative_error(run.logits, test::read_fixture_doubles(expected, "logits")), logits_tol) << arch << " logits";
  const double loss = test::read_fixture_doubles(expected, "loss")[0];
  EXPECT_LE(std::fabs(run.loss - loss) / std::fabs(loss), logits_tol) << arch << " loss " << run.loss << " vs " << loss;
  int checked = 0;
  for (const std::string& name : weights.names()) {
    const double g = test::relative_error(test::hf_slice(run.entries, run.grads, name), test::read_fixture_doubles(expected, "grad." + name));
    EXPECT_LE(g, grad_tol) << arch << " grad." << name;
    const double w = test::relative_error(test::hf_slice(run.entries, run.updated, name), test::read_fixture_doubles(expected, "adamw." + name));
    EXPECT_LE(w, grad_tol) << arch << " adamw." << name;
    ++checked;
  }
  EXPECT_GT(checked, 15);
}

}  // namespace

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, MatchesTransformersInFloat64) { check_fixture(GetParam(), "fp64", 1e-10, 1e-10); }
TEST_P(HfFixture, MatchesTransformersInFloat32) { check_fixture(GetParam(), "fp32", 1e-5, 1e-4); }

TEST_P(HfFixture, ExportThenImportIsExact) {
  const std::string arch = GetParam();
  const ModelConfig config = load_model_config(fixture_dir(arch));
  const auto entries = plan_parameters(config);
  Context ctx;
  std::vector<float> original(total_numel(entries), 0.0f), reloaded(original.size(), 0.0f);
  Tensor flat(original.data(), DType::f32, Device::cpu, {static_cast<int64_t>(original.size())});
  io::load_hf_weights(ctx, fixture_dir(arch), entries, flat);
  const std::string out = test::temp_dir("export_" + arch);
  // A small shard limit forces the sharded layout with model.safetensors.index.json.
  io::save_hf_model(out, config, entries, flat, DType::f32, 64 * 1024);
  ASSERT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  const ModelConfig again = load_model_config(out);
  EXPECT_EQ(again.model_type, config.model_type);
  EXPECT_EQ(again.head_dim, config.head_dim);
  EXPECT_EQ(again.tie_word_embeddings, config.tie_word_embeddings);
  Tensor flat2(reloaded.data(), DType::f32, Device::cpu, {static_cast<int64_t>(reloaded.size())});
  io::load_hf_weights(ctx, out, plan_parameters(again), flat2);
  EXPECT_EQ(0, std::memcmp(original.data(), reloaded.data(), original.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Architectures, HfFixture, ::testing::Values("llama", "qwen2", "qwen3"));

// --max-shard-size: units, one decimal point, and a named error for anything else ("." threw a
// bare "stod", and "1.5.5MB" was read as 1.5MB).
TEST(ByteSize, ParsesUnitsAndNamesBadText) {
  EXPECT_EQ(ingot::io::parse_byte_size("5GB"), 5'000'000'000);
  EXPECT_EQ(ingot::io::parse_byte_size("1.5MiB"), 1'572'864);
  EXPECT_EQ(ingot::io::parse_byte_size("100"), 100);
  EXPECT_EQ(ingot::io::parse_byte_size(".5KB"), 500);
  for (const std::string& bad : std::vector<std::string>{".", "..5", "1.5.5MB", std::string(300, '9'), "MB", "5XB", "0"}) {
    std::string message = "no error";
    try {
      ingot::io::parse_byte_size(bad);
    } catch (const ingot::Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("\"" + bad + "\""), std::string::npos) << bad << ": " << message;
  }
}
