// The training step (train/train_step.h) on the CPU reference, in float64: two accumulated
// micro-batches through the staged inputs and adamw_step must equal the same step written out by
// hand (forward_backward per micro-batch scaled by 1/count, then AdamW with divisor 1), and a
// shorter input bound in between (as generation does) must not change the next step.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ingot/model/transformer.h"
#include "ingot/optim/adamw.h"
#include "ingot/ops/ops.h"
#include "ingot/train/memory_plan.h"
#include "ingot/train/train_step.h"

using namespace ingot;

namespace {

ModelConfig tiny() {
  return parse_model_config(R"({"model_type": "qwen3", "vocab_size": 61, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 64, "tie_word_embeddings": true})", "test config");
}

constexpr int64_t B = 1, T = 12, kAccum = 2;  // B = 1: shorter inputs (generation) can be bound

// Micro-batch `micro` of step `step`: a pattern with a few ignored targets.
void fill(int64_t step, int64_t micro, int32_t* ids, int32_t* targets, int32_t* positions, int32_t* segments) {
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = static_cast<int32_t>((i * 5 + micro * 11 + step * 3) % 61);
    targets[i] = i % 7 == 3 ? ops::kIgnoreIndex : static_cast<int32_t>((i * 5 + 5 + micro * 11 + step * 3) % 61);
    positions[i] = static_cast<int32_t>(i % T);
    if (segments) segments[i] = 0;
  }
}

AdamWConfig adam_config() {
  AdamWConfig a;
  a.weight_decay = 0.1;
  a.max_grad_norm = 0.05;  // clips
  return a;
}

}  // namespace

TEST(TrainStep, EqualsTheStepWrittenOutByHand) {
  Context ctx;
  ctx.num_threads = 2;
  const Recipe recipe = make_recipe("fp64", Device::cpu);
  Transformer a(tiny(), recipe, ctx, B, T), b(tiny(), recipe, ctx, B, T);
  a.init_random(5);
  b.init_random(5);
  AdamW opt_a(a.entries(), recipe, ctx, adam_config(), a.weights());
  AdamW opt_b(b.entries(), recipe, ctx, adam_config(), b.weights());
  TrainStep runner(ctx, a, opt_a, kAccum, false, true);

  for (int64_t step = 0; step < 3; ++step) {
    // Through TrainStep.
    int64_t count = 0;
    for (int64_t micro = 0; micro < kAccum; ++micro) {
      const data::BatchBuffers buf = runner.host_batch(micro);
      fill(step, micro, buf.input_ids, buf.targets, buf.positions, buf.segment_ids);
      for (int64_t i = 0; i < B * T; ++i) count += buf.targets[i] != ops::kIgnoreIndex;
    }
    runner.launch(step + 1, step + 1, 1e-2, count);
    const StepResult got = runner.collect();

    // By hand: the mean-loss gradient directly, then AdamW with divisor 1.
    std::vector<int32_t> ids(B * T), targets(B * T), positions(B * T);
    ops::zero(ctx, b.grads());
    double loss_sum = 0;
    for (int64_t micro = 0; micro < kAccum; ++micro) {
      fill(step, micro, ids.data(), targets.data(), positions.data(), nullptr);
      b.load_batch({ids.data(), targets.data(), positions.data(), nullptr});
      loss_sum += b.forward_backward(1.0 / static_cast<double>(count));
    }
    const double norm = opt_b.step(b.weights(), b.grads(), 1e-2, step + 1);

    EXPECT_EQ(got.step, step + 1);
    EXPECT_NEAR(got.loss_sum, loss_sum, 1e-12 * std::abs(loss_sum)) << "step " << step;
    EXPECT_NEAR(got.grad_norm, norm, 1e-12 * norm) << "step " << step;
    const std::vector<double> wa = to_host_doubles(ctx, a.weights()), wb = to_host_doubles(ctx, b.weights());
    double diff = 0, ref = 0;
    for (size_t i = 0; i < wa.size(); ++i) diff += (wa[i] - wb[i]) * (wa[i] - wb[i]), ref += wb[i] * wb[i];
    EXPECT_LE(std::sqrt(diff / ref), 1e-12) << "weights after step " << step;

    // A generation-style shorter input in between must not disturb the next step.
    if (step == 1) {
      a.load_batch({ids.data(), targets.data(), positions.data(), nullptr}, 5);
      a.forward_loss();
    }
  }
}

// GradWrite::overwrite (a step's first micro-batch) must leave exactly the gradients that zeroing
// the buffer and accumulating gives, whatever the buffer held: it starts as NaN here, so a range
// that is neither written by a GEMM nor zeroed first fails. Tied (Qwen3: qk-norms) and untied
// embeddings with attention biases (Qwen2.5 style), and an LM head in several chunks.
TEST(TrainStep, OverwrittenGradientsEqualZeroedAndAccumulated) {
  const char* configs[] = {
      R"({"model_type": "qwen3", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "max_position_embeddings": 64, "tie_word_embeddings": true})",
      R"({"model_type": "qwen2", "vocab_size": 61, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 64, "tie_word_embeddings": false})"};
  for (const char* json : configs) {
    const ModelConfig config = parse_model_config(json, "test config");
    Context ctx;
    ctx.num_threads = 2;
    const Recipe recipe = make_recipe("fp32", Device::cpu);
    const int64_t chunk_tokens = 5;  // 12 tokens: three LM-head chunks
    Transformer overwritten(config, recipe, ctx, B, T, chunk_tokens), zeroed(config, recipe, ctx, B, T, chunk_tokens);
    overwritten.init_random(9);
    zeroed.init_random(9);
    std::vector<int32_t> ids(B * T), targets(B * T), positions(B * T);
    fill(0, 0, ids.data(), targets.data(), positions.data(), nullptr);
    std::vector<double> loss_a(1), loss_b(1);
    const Tensor sum_a(loss_a.data(), DType::f64, Device::cpu, {1}), sum_b(loss_b.data(), DType::f64, Device::cpu, {1});

    Tensor g = overwritten.grads();
    float* dirty = static_cast<float*>(g.data);
    for (int64_t i = 0; i < g.numel(); ++i) dirty[i] = std::numeric_limits<float>::quiet_NaN();
    overwritten.load_batch({ids.data(), targets.data(), positions.data(), nullptr});
    overwritten.forward_backward_into(0.1, sum_a, false, Transformer::GradWrite::overwrite);

    ops::zero(ctx, zeroed.grads());
    zeroed.load_batch({ids.data(), targets.data(), positions.data(), nullptr});
    zeroed.forward_backward_into(0.1, sum_b, false, Transformer::GradWrite::accumulate);

    const std::vector<double> ga = to_host_doubles(ctx, overwritten.grads()), gb = to_host_doubles(ctx, zeroed.grads());
    ASSERT_EQ(ga.size(), gb.size());
    int64_t differing = 0;
    for (size_t i = 0; i < ga.size(); ++i) differing += !(ga[i] == gb[i]);  // NaN counts as differing
    EXPECT_EQ(differing, 0) << config.model_type << ": gradient elements differ";
    EXPECT_EQ(loss_a[0], loss_b[0]);

    // A second micro-batch accumulates on top in both.
    fill(0, 1, ids.data(), targets.data(), positions.data(), nullptr);
    overwritten.load_batch({ids.data(), targets.data(), positions.data(), nullptr});
    overwritten.forward_backward_into(0.1, sum_a, true, Transformer::GradWrite::accumulate);
    zeroed.load_batch({ids.data(), targets.data(), positions.data(), nullptr});
    zeroed.forward_backward_into(0.1, sum_b, true, Transformer::GradWrite::accumulate);
    EXPECT_TRUE(to_host_doubles(ctx, overwritten.grads()) == to_host_doubles(ctx, zeroed.grads()))
        << config.model_type << ": after a second, accumulated micro-batch";
  }
}

// The optimizer hands adamw_step its rounding seed (AdamWConfig::rounding_seed, the trainer's
// `seed`) and the update number (scalars slot kAdamWUpdate): three AdamW::step calls on bf16
// weights and moments with a recipe that rounds stochastically equal, bit for bit, the op called
// by hand with that seed and t = 1, 2, 3; another seed rounds differently.
TEST(TrainStep, AdamWPassesTheRoundingSeedAndUpdateNumber) {
  Context ctx;
  ctx.num_threads = 1;
  Recipe recipe;  // the bf16 recipe's storage, on the CPU op (make_recipe keeps bf16 for CUDA)
  recipe.name = "bf16";
  recipe.param = recipe.activation = recipe.optimizer_state = DType::bf16;
  recipe.master_weights = false;
  recipe.stochastic_rounding = true;
  const int64_t n = 256;
  ParamEntry entry;
  entry.name = "w";
  entry.shape = {16, 16};
  entry.numel = n;
  std::vector<uint16_t> w0(n);
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) {
    w0[i] = f32_to_bf16(0.5f + 0.001f * static_cast<float>(i % 13));
    g[i] = 0.01f * static_cast<float>(i % 7 - 3);
  }
  const double lr = 1e-4;
  const Tensor grads(g.data(), DType::f32, Device::cpu, {n});
  auto via_optimizer = [&](uint64_t seed) {
    std::vector<uint16_t> w = w0;
    const Tensor weights(w.data(), DType::bf16, Device::cpu, {n});
    AdamWConfig config;
    config.rounding_seed = seed;
    AdamW optimizer({entry}, recipe, ctx, config, weights);
    for (int64_t t = 1; t <= 3; ++t) optimizer.step(weights, grads, lr, t);
    return w;
  };
  std::vector<uint16_t> w = w0, m(n, 0), v(n, 0);
  const AdamWConfig defaults;
  ops::AdamWConstants constants;
  constants.stochastic_rounding = true;
  constants.rounding_seed = 21;
  std::vector<int64_t> runs = {0, n};  // a matrix takes weight decay (0 by default)
  for (int t = 1; t <= 3; ++t) {
    std::vector<double> s(ops::kAdamWSlots, 0.0);
    s[ops::kAdamWStepSize] = lr / (1.0 - std::pow(defaults.beta1, t));
    s[ops::kAdamWBiasCorrection2] = std::sqrt(1.0 - std::pow(defaults.beta2, t));
    s[ops::kAdamWDecay] = 1.0 - lr * defaults.weight_decay;
    s[ops::kAdamWGradDivisor] = 1.0;
    s[ops::kAdamWMaxGradNorm] = defaults.max_grad_norm;
    s[ops::kAdamWUpdate] = t;
    ops::adamw_step(ctx, Tensor(w.data(), DType::bf16, Device::cpu, {n}), grads,
                    Tensor(m.data(), DType::bf16, Device::cpu, {n}), Tensor(v.data(), DType::bf16, Device::cpu, {n}),
                    Tensor(), Tensor(runs.data(), DType::i64, Device::cpu, {1, 2}),
                    Tensor(s.data(), DType::f64, Device::cpu, {int64_t{ops::kAdamWSlots}}), constants);
  }
  const std::vector<uint16_t> seed21 = via_optimizer(21);
  EXPECT_TRUE(seed21 == w) << "AdamW::step against the op with seed 21 and t = 1, 2, 3";
  EXPECT_TRUE(seed21 != w0) << "the weights must move";
  EXPECT_TRUE(via_optimizer(22) != seed21) << "another seed must round differently";
}

// From scratch, the pad_token_id row of the input embedding starts at zero, as transformers'
// initialisation leaves nn.Embedding's padding_idx row (a tied LM head shares it); other rows do not.
TEST(TrainStep, PaddingRowOfTheEmbeddingStartsAtZero) {
  Context ctx;
  ctx.num_threads = 2;
  ModelConfig config = tiny();
  config.pad_token_id = 7;
  Transformer model(config, make_recipe("fp32", Device::cpu), ctx, B, T);
  model.init_random(5);
  const std::vector<double> w = to_host_doubles(ctx, model.weights());
  const ParamEntry& embed = model.entries().front();
  ASSERT_EQ(embed.kind, ParamKind::embedding);
  const int64_t C = embed.shape[1];
  for (int64_t row : {6, 7, 8}) {
    double sum_sq = 0;
    for (int64_t c = 0; c < C; ++c) sum_sq += w[embed.offset + row * C + c] * w[embed.offset + row * C + c];
    if (row == 7) EXPECT_EQ(sum_sq, 0.0) << "row " << row;
    else EXPECT_GT(sum_sq, 0.0) << "row " << row;
  }
}

// Untied, the pad id's row of the input embedding gets no gradient at all (tied, the LM head's
// share still reaches it: the qwen2 HF fixture); the rows of the other ids in the batch do.
TEST(TrainStep, PaddingRowOfAnUntiedEmbeddingGetsNoGradient) {
  Context ctx;
  ctx.num_threads = 2;
  ModelConfig config = tiny();
  config.tie_word_embeddings = false;
  config.pad_token_id = 5;
  Transformer model(config, make_recipe("fp64", Device::cpu), ctx, B, T);
  model.init_random(3);
  std::vector<int32_t> ids(B * T), targets(B * T), positions(B * T);
  for (int64_t i = 0; i < B * T; ++i) {
    ids[i] = static_cast<int32_t>(i % 3 == 0 ? 5 : 10 + i);  // the pad id at 0, 3, 6, 9
    targets[i] = static_cast<int32_t>((i * 7 + 1) % 61);
    positions[i] = static_cast<int32_t>(i);
  }
  HostBatch batch{ids.data(), targets.data(), positions.data(), nullptr};
  model.load_batch(batch);
  model.forward_backward(1.0);
  const std::vector<double> g = to_host_doubles(ctx, model.grads());
  const ParamEntry& embed = model.entries().front();
  const int64_t C = embed.shape[1];
  auto row_norm = [&](int64_t row) {
    double sum_sq = 0;
    for (int64_t c = 0; c < C; ++c) sum_sq += g[embed.offset + row * C + c] * g[embed.offset + row * C + c];
    return sum_sq;
  };
  EXPECT_EQ(row_norm(5), 0.0);
  EXPECT_GT(row_norm(11), 0.0);
}

// Weight decay at the config's groups, by hand: with zero gradients one AdamW step only decays, so
// each decayed weight becomes w (1 - lr wd) and every other stays exactly as it was. By default
// (as torch users group them, and HF's Trainer for norms and biases) only matrices decay; the
// config's flags add norms and embeddings. The train-step tests compare two optimizers that share
// any grouping error, and dropping a norm into the decayed ranges passed them.
TEST(TrainStep, WeightDecayFollowsTheConfigsGroups) {
  Context ctx;
  const Recipe recipe = make_recipe("fp64", Device::cpu);
  const double lr = 1e-2, wd = 0.1;
  for (const bool decay_all : {false, true}) {
    Transformer model(tiny(), recipe, ctx, B, T);
    model.init_random(3);
    const Tensor w = model.weights();
    const double* p = w.ptr<double>();
    const std::vector<double> before(p, p + w.numel());
    ops::zero(ctx, model.grads());
    AdamWConfig config;
    config.weight_decay = wd;
    config.max_grad_norm = 0;
    config.decay_norms = config.decay_embeddings = decay_all;
    AdamW optimizer(model.entries(), recipe, ctx, config, w);
    optimizer.step(w, model.grads(), lr, 1);
    int decayed_entries = 0, kept_entries = 0;
    for (const ParamEntry& e : model.entries()) {
      const bool decays = e.kind == ParamKind::matrix || decay_all;
      (decays ? decayed_entries : kept_entries) += 1;
      for (int64_t i = e.offset; i < e.offset + e.numel; ++i) {
        if (decays)
          ASSERT_NEAR(p[i], before[size_t(i)] * (1 - lr * wd), 1e-15 * std::fabs(before[size_t(i)]))
              << e.name << " [" << i - e.offset << "]";
        else
          ASSERT_EQ(p[i], before[size_t(i)]) << e.name << " [" << i - e.offset << "] decayed";
      }
    }
    EXPECT_GT(decayed_entries, 0);
    if (!decay_all) EXPECT_GT(kept_entries, 0);
  }
}

// The memory plan (what `ingot info` prints and the trainer checks a run against before step 1)
// counts what the run allocates: each category is its arena's size to within the arena's
// alignment slack (the plan leaves that to its 64 MiB margin), and the moments are two values a
// parameter in the state's dtype (an optimizer charged half passed the suite).
TEST(TrainStep, MemoryPlanCountsWhatTheRunAllocates) {
  Context ctx;
  for (const char* precision : {"fp32", "fp64"}) {
    SCOPED_TRACE(precision);
    const Recipe recipe = make_recipe(precision, Device::cpu);
    const TrainingMemory plan = estimate_training_memory(tiny(), recipe, Device::cpu, B, T);
    Transformer model(tiny(), recipe, ctx, B, T);
    AdamW optimizer(model.entries(), recipe, ctx, AdamWConfig{}, model.weights());
    const Transformer::MemoryUse used = model.memory_use();
    const std::pair<int64_t, int64_t> categories[] = {{plan.params, used.params},
                                                      {plan.grads, used.grads},
                                                      {plan.activations, used.activations},
                                                      {plan.optimizer, optimizer.state_bytes()},
                                                      {plan.master, recipe.master_weights ? optimizer.master_bytes() : 0}};
    for (const auto& [planned, allocated] : categories) {
      EXPECT_LE(planned, allocated);
      EXPECT_LT(allocated - planned, 4096);
    }
    const int64_t P = total_numel(plan_parameters(tiny()));
    const int64_t moments = 2 * P * int64_t(dtype_size(recipe.optimizer_state));
    EXPECT_GE(plan.optimizer, moments);
    EXPECT_LT(plan.optimizer, moments + 4096);  // alignment only
  }
}
