// `ingot bench`: training throughput of a randomly initialised model at a fixed shape. Warm-up
// steps, then the median of timed steps (synchronised host clock around each whole step), reported
// as tokens/s, MFU (tokens/s x FLOPs/token / 989.4e12, the FLOPs of docs/perf.md's opening), step ms and peak memory.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>

#include "ingot/model/config.h"
#include "ingot/recipe/recipe.h"

namespace ingot {

// The upper bound of --steps and --warmup keeps warmup + steps (and the step counter AdamW takes)
// from overflowing: a sum past 2^63 ran no step and read the median of none.
constexpr int64_t kMaxBenchSteps = int64_t{1} << 30;

struct BenchOptions {
  std::string model;            // HF model directory (config.json) or a preset name
  int64_t seq = 4096, micro_batch = 4, steps = 20, warmup = 3;
  std::string device = "auto";
  RecipeOptions recipe;          // the bf16 recipe's master weights, gradient and moment dtypes
  bool cuda_graph = true;       // replay the captured step, as `ingot train` does
  std::string recompute = "none";
  bool json = false;            // one JSON line instead of a table
  bool profile = false;         // after timing, one step with every op timed: the step breakdown
  int64_t packed_doc_len = 0;   // > 0: rows packed with documents of mean length N (segment ids), as SFT trains
  int64_t logits_chunk_tokens = 0;  // tokens per LM-head + loss chunk, as the config key; 0: automatic
};

struct BenchResult {
  std::string model;
  double tokens_per_s = 0, mfu = 0, step_ms = 0, peak_gib = 0, flops_per_token = 0;
};

// Presets with the public shapes.
inline constexpr const char* kBenchPresets[] = {"llama-3.2-1b", "qwen3-0.6b", "qwen2.5-0.5b", "llama-3-8b"};
ModelConfig bench_preset(const std::string& name);
bool is_bench_preset(const std::string& name);
// 6 * N_matmul + 6 * L * S * H * Dh (causal attention: half of the full 12).
double flops_per_token(const ModelConfig& config, int64_t seq);
// The same with the attention term counted over the (query, key) pairs that attend:
// 6 * N_matmul + 12 * L * H * Dh * mean_keys, mean_keys the mean number of keys a token attends
// to ((S + 1) / 2 for whole causal rows: the line above within one key a token).
double flops_per_token_attending(const ModelConfig& config, double mean_keys);

// The result (a table, or with --json one JSON line) goes to `out`; notes, warnings and the
// --profile breakdown go to `log`, so that --json output stays one parseable line.
BenchResult run_bench(const BenchOptions& options, std::ostream& out, std::ostream& log);

}  // namespace ingot
