#include "ingot/train/bench.h"

#include <algorithm>
#include <iterator>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "ingot/core/error.h"
#include "ingot/core/rng.h"
#include "ingot/io/json_util.h"
#include "ingot/model/transformer.h"
#include "ingot/ops/profile.h"
#include "ingot/optim/adamw.h"
#include "ingot/train/memory_plan.h"
#include "ingot/train/checkpoint.h"
#include "ingot/train/train_step.h"
#include "ingot/train/trainer.h"
#ifdef INGOT_HAVE_CUDA
#include "ingot/ops/cuda/device.h"
#endif

namespace ingot {

bool is_bench_preset(const std::string& name) {
  return std::find(std::begin(kBenchPresets), std::end(kBenchPresets), name) != std::end(kBenchPresets);
}

ModelConfig bench_preset(const std::string& name) {
  nlohmann::json j;
  if (name == "llama-3.2-1b") {
    j = {{"model_type", "llama"}, {"vocab_size", 128256}, {"hidden_size", 2048}, {"intermediate_size", 8192},
         {"num_hidden_layers", 16}, {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"head_dim", 64},
         {"rope_theta", 500000.0}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 131072},
         {"tie_word_embeddings", true},
         {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}}};
  } else if (name == "qwen3-0.6b") {
    j = {{"model_type", "qwen3"}, {"vocab_size", 151936}, {"hidden_size", 1024}, {"intermediate_size", 3072},
         {"num_hidden_layers", 28}, {"num_attention_heads", 16}, {"num_key_value_heads", 8}, {"head_dim", 128},
         {"rope_theta", 1000000.0}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 40960},
         {"tie_word_embeddings", true}};
  } else if (name == "qwen2.5-0.5b") {
    j = {{"model_type", "qwen2"}, {"vocab_size", 151936}, {"hidden_size", 896}, {"intermediate_size", 4864},
         {"num_hidden_layers", 24}, {"num_attention_heads", 14}, {"num_key_value_heads", 2},
         {"rope_theta", 1000000.0}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 32768},
         {"tie_word_embeddings", true}};
  } else if (name == "llama-3-8b") {
    j = {{"model_type", "llama"}, {"vocab_size", 128256}, {"hidden_size", 4096}, {"intermediate_size", 14336},
         {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
         {"rope_theta", 500000.0}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 8192},
         {"tie_word_embeddings", false}};
  } else {
    std::string names;
    for (const char* preset : kBenchPresets) names += (names.empty() ? "" : ", ") + std::string(preset);
    fail("unknown bench model \"", name, "\": give a model, checkpoint or run directory, or one of ", names);
  }
  return parse_model_config(j.dump(), "preset " + name);
}

double flops_per_token_attending(const ModelConfig& c, double mean_keys) {
  return 6.0 * static_cast<double>(count_matmul_parameters(c)) +
         12.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads * c.head_dim) * mean_keys;
}

double flops_per_token(const ModelConfig& c, int64_t seq) {
  return flops_per_token_attending(c, static_cast<double>(seq) / 2);
}

BenchResult run_bench(const BenchOptions& o, std::ostream& out, std::ostream& log) {
  INGOT_CHECK(o.steps >= 1 && o.steps <= kMaxBenchSteps, "ingot bench: --steps must lie in [1, ", kMaxBenchSteps, "], got ", o.steps);
  INGOT_CHECK(o.logits_chunk_tokens >= 0, "ingot bench: --logits-chunk-tokens must be 0 (automatic) or more, got ",
              o.logits_chunk_tokens);
  INGOT_CHECK(o.warmup >= 0 && o.warmup <= kMaxBenchSteps, "ingot bench: --warmup must lie in [0, ", kMaxBenchSteps, "], got ",
              o.warmup);
  INGOT_CHECK(o.seq >= 1 && o.micro_batch >= 1, "ingot bench: --seq and --micro-batch must be positive, got ", o.seq,
              " and ", o.micro_batch);
  // Flags that do not fit together, or do not apply where the bench runs: usage errors (exit 2).
  if (o.seq > kMaxTokensPerStep || o.micro_batch > kMaxTokensPerStep / o.seq)
    fail_as<UsageError>("ingot bench: --micro-batch x --seq = ", o.micro_batch, " x ", o.seq,
                        " tokens is above the limit of ", kMaxTokensPerStep);
  if (o.packed_doc_len < 0 || o.packed_doc_len > o.seq)
    fail_as<UsageError>("ingot bench: --packed-doc-len must lie in [1, --seq ", o.seq, "] (0: whole rows), got ",
                        o.packed_doc_len);
  // A directory: a model, a checkpoint or a run's output_dir (its newest checkpoint), as generate,
  // info and export take it. Only its config is used.
  // A folder, a name with a '/', or anything on disk that is not a preset's name is a path (a file,
  // a missing folder: said so, as info says it); a file named like a preset (a shell redirect's
  // output, say) does not hide the preset.
  std::error_code ec;
  const bool is_path = std::filesystem::is_directory(o.model, ec) || o.model.find('/') != std::string::npos ||
                       (std::filesystem::exists(std::filesystem::symlink_status(o.model, ec)) &&
                        !is_bench_preset(o.model));
  ModelConfig config = is_path ? load_model_config(resolve_model_dir(o.model)) : bench_preset(o.model);
  // As in `ingot train`: RoPE reaches any position, so the timing holds; a pretrained model's quality would not.
  if (o.seq > config.max_position_embeddings)
    log << "warning: --seq " << o.seq << " is above max_position_embeddings " << config.max_position_embeddings
        << " of " << o.model << ": a pretrained model has not seen those positions\n";
  DeviceContext device(o.device, 0);
  Context& ctx = device.get();
  // bench has no --precision: the device picks it, so a bf16-only flag on the CPU is a device error.
  // (Other bad values fall through to make_recipe, whose message names them.)
  if (ctx.device != Device::cuda && (o.recipe.grad_dtype == "bf16" || o.recipe.optimizer_state_dtype == "bf16" ||
                                     o.recipe.stochastic_rounding || !o.recipe.master_weights))
    fail_as<UsageError>("ingot bench: --grad-dtype / --optimizer-state-dtype bf16, --stochastic-rounding and "
                        "--no-master-weights belong to the bf16 recipe, which runs on CUDA (--device cuda); the CPU "
                        "benches fp32");
  if (ctx.device != Device::cuda && !o.cuda_graph)
    fail_as<UsageError>("ingot bench: --no-cuda-graph turns off the CUDA graph replay of the step, which the CPU "
                        "does not have (--device cuda)");
  const Recipe recipe = make_recipe(ctx.device == Device::cuda ? "bf16" : "fp32", ctx.device, o.recipe);
  INGOT_CHECK(!recipe.stochastic_rounding || rounds_stochastically(recipe),
              "ingot bench: --stochastic-rounding rounds the bf16 stores of the update, and with master weights and f32 "
              "moments there are none: add --no-master-weights or --optimizer-state-dtype bf16");
  const int64_t B = o.micro_batch, T = o.seq;

  const Recompute recompute = parse_recompute(o.recompute);
  TrainingMemory memory = estimate_training_memory(config, recipe, ctx.device, B, T, o.logits_chunk_tokens, recompute,
                                                    o.packed_doc_len > 0);
  const std::string workspace_note = fit_attention_workspace(memory, ctx);
  if (!workspace_note.empty()) log << "note: " << workspace_note << "\n";
  check_memory_fits(memory, ctx, device.description(),
                    ctx.device == Device::cuda
                        ? "try a smaller --micro-batch or --seq, --recompute elementwise or block, --no-master-weights, "
                          "or --grad-dtype / --optimizer-state-dtype bf16"
                        : "try a smaller --micro-batch or --seq, or --recompute elementwise or block",
                    parameter_state_hint(recipe, true));
  Transformer model(config, recipe, ctx, B, T, o.logits_chunk_tokens, recompute);
  model.init_random(1);
  AdamWConfig adam;
  adam.weight_decay = 0.01;
  AdamW optimizer(model.entries(), recipe, ctx, adam, model.weights());

  // The trainer's step (train/train_step.h): staged inputs, captured CUDA graph, async results.
  const bool packed = o.packed_doc_len > 0;
  TrainStep runner(ctx, model, optimizer, 1, packed, o.cuda_graph);
  // Random tokens, never zeros: uniform over the vocabulary. Packed rows: documents of random
  // length, uniform in [1, 2 N - 1] (mean N), back to back and cut at the row's end; positions
  // restart and segment ids count up at each document, as the loader's packed rows do.
  std::vector<int32_t> inputs(B * T), targets(B * T), positions(B * T), segments(B * T, 0);
  double attending_pairs = 0;  // (query, key) pairs that attend, over the batch
  for (int64_t row = 0, draw = 0; row < B; ++row) {
    int64_t left = 0, position = 0;
    int32_t segment = -1;
    for (int64_t t = 0; t < T; ++t) {
      if (left == 0) {
        left = packed ? 1 + static_cast<int64_t>(splitmix64(~draw++) % uint64_t(2 * o.packed_doc_len - 1)) : T;
        position = 0;
        ++segment;
      }
      --left;
      const int64_t i = row * T + t;
      inputs[i] = static_cast<int32_t>(1 + splitmix64(2 * i) % (config.vocab_size - 1));
      targets[i] = static_cast<int32_t>(1 + splitmix64(2 * i + 1) % (config.vocab_size - 1));
      positions[i] = static_cast<int32_t>(position++);
      segments[i] = segment;
      attending_pairs += static_cast<double>(position);
    }
  }
  auto synchronize = [&]() {
#ifdef INGOT_HAVE_CUDA
    if (ctx.device == Device::cuda) cuda::synchronize(ctx.cuda);
#endif
  };
  auto train_step = [&](int64_t s, bool eager) {
    const data::BatchBuffers b = runner.host_batch(0);
    std::copy(inputs.begin(), inputs.end(), b.input_ids);
    std::copy(targets.begin(), targets.end(), b.targets);
    std::copy(positions.begin(), positions.end(), b.positions);
    std::copy(segments.begin(), segments.end(), b.segment_ids);
    runner.launch(s + 1, s + 1, 1e-4, B * T, eager);
    runner.collect();
  };
  std::vector<double> step_ms;
  for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
    synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    train_step(s, false);
    synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= o.warmup) step_ms.push_back(ms);
  }
  std::sort(step_ms.begin(), step_ms.end());
  if (o.profile) {
    ops::reset_profile();
    ops::set_profiling(true);
    train_step(o.warmup + o.steps, true);
    ops::set_profiling(false);
    double total = 0;
    for (const auto& [name, st] : ops::profile_stats()) total += st.ms;
    const double median = step_ms[step_ms.size() / 2];
    log << "step breakdown (one step, each op timed alone; median unprofiled step " << median << " ms):\n";
    char line[200];
    std::snprintf(line, sizeof line, "%-22s %6s %10s %7s %12s\n", "op", "calls", "ms", "share", "rate");
    log << line;
    std::vector<std::pair<std::string, ops::OpStats>> rows(ops::profile_stats().begin(), ops::profile_stats().end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    for (const auto& [name, st] : rows) {
      // GFLOP/s below 1 TFLOP/s, so that CPU rates do not print as 0.
      const double tflops = st.flops / st.ms / 1e9;
      const std::string rate = st.flops <= 0 ? std::to_string(static_cast<int64_t>(st.bytes / st.ms / 1e6)) + " GB/s"
                               : tflops >= 1 ? std::to_string(static_cast<int64_t>(tflops)) + " TFLOP/s"
                                             : std::to_string(static_cast<int64_t>(tflops * 1e3)) + " GFLOP/s";
      std::snprintf(line, sizeof line, "%-22s %6lld %10.2f %6.1f%% %12s\n", name.c_str(), static_cast<long long>(st.calls),
                    st.ms, 100.0 * st.ms / std::max(median, total), rate.c_str());
      log << line;
    }
    std::snprintf(line, sizeof line, "%-22s %6s %10.2f %6.1f%%\n", "host/idle (step - ops)", "", std::max(0.0, median - total),
                  100.0 * std::max(0.0, median - total) / std::max(median, total));
    log << line;
    if (packed)  // the ops see segment ids, not how many pairs attend: their rates assume whole causal rows
      log << "(attention rates count whole causal rows; these packed rows attend "
          << 100.0 * attending_pairs / (static_cast<double>(B) * T * (T + 1) / 2) << "% of those pairs)\n";
  }
  BenchResult r;
  r.model = o.model;
  r.step_ms = step_ms[step_ms.size() / 2];
  r.tokens_per_s = static_cast<double>(B * T) / (r.step_ms / 1000.0);
  r.flops_per_token = packed ? flops_per_token_attending(config, attending_pairs / static_cast<double>(B * T))
                             : flops_per_token(config, T);
  r.mfu = r.tokens_per_s * r.flops_per_token / 989.4e12;
  const auto use = model.memory_use();
  int64_t bytes = use.params + use.grads + use.activations + optimizer.state_bytes() + optimizer.master_bytes();
#ifdef INGOT_HAVE_CUDA
  if (ctx.device == Device::cuda) bytes += cuda::kCublasLtWorkspaceBytes + cuda::scratch_bytes(ctx.cuda);
#endif
  r.peak_gib = static_cast<double>(bytes) / (1024.0 * 1024 * 1024);
  // What the memory plan charged, beside what the run allocated: the plan is what refuses a run
  // before step 1, so a gap between the two is worth seeing.
  const double planned_gib = static_cast<double>(memory.total()) / (1024.0 * 1024 * 1024);

  if (o.json) {
    nlohmann::ordered_json j = {{"system", "ingot"}, {"model", o.model}, {"seq", T}, {"micro_batch", B},
                                {"tokens_per_s", r.tokens_per_s},
                                {"mfu", ctx.device == Device::cuda ? nlohmann::ordered_json(r.mfu) : nlohmann::ordered_json(nullptr)},
                                {"step_ms", r.step_ms},
                                {"peak_gib", r.peak_gib}, {"planned_gib", planned_gib},
                                {"flops_per_token", r.flops_per_token},
                                {"device", device.description()}};
    if (packed) j["packed_doc_len"] = o.packed_doc_len;
#ifdef INGOT_HAVE_CUDA
    if (ctx.device == Device::cuda) j["libraries"] = cuda::library_versions();
#endif
    out << io::dump_json(j) << std::endl;  // --model may name a folder in Latin-1
  } else {
    out << "model " << o.model << " (" << count_parameters(config) << " parameters), seq " << T << " x micro-batch " << B
        << ", " << device.description() << ", precision " << describe(recipe) << "\n";
    if (packed)
      out << "packed rows: document lengths drawn with mean " << o.packed_doc_len
          << ", the last of a row cut at its end (each token attends to "
          << attending_pairs / static_cast<double>(B * T) << " keys on average; FLOPs are counted over those pairs)\n";
    // MFU as DESIGN.md defines it: against the dense bf16 peak of an H100/H200 SXM, which says
    // nothing about a CPU.
    // Three significant digits at least: a slow model's 0.5 tokens/s printed as 0.
    char rate[32];
    std::snprintf(rate, sizeof rate, r.tokens_per_s >= 100 ? "%.0f" : "%.3g", r.tokens_per_s);
    out << "median of " << step_ms.size() << " steps after " << o.warmup << " warm-up: step " << r.step_ms << " ms | "
        << rate << " tokens/s | ";
    if (ctx.device == Device::cuda) out << "MFU " << 100.0 * r.mfu << "% | ";
    out << "memory " << format_bytes(static_cast<int64_t>(r.peak_gib * 1073741824.0)) << " (planned "
        << format_bytes(memory.total()) << ")\n";
  }
  return r;
}

}  // namespace ingot
