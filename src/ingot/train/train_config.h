// TrainConfig: every key `ingot train CONFIG.yaml` accepts, with its default. Key names follow
// Hugging Face TrainingArguments / axolotl where one exists. docs/config.md lists them all; the
// table in train_config.cpp is the single source both the parser and `ingot train --list-keys` use.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "ingot/model/config.h"
#include "ingot/recipe/recipe.h"

namespace ingot {

// The most tokens one optimizer step may hold (the host stages ids, targets, positions and segments:
// 16 bytes a token). `ingot info` and `ingot bench` apply it to one micro-batch.
constexpr int64_t kMaxTokensPerStep = int64_t{1} << 28;

struct TrainConfig {
  // model: exactly one of `model` (a Hugging Face directory to start from) or `model_config`
  std::string model;                 // HF dir: config.json + safetensors
  std::string model_config;          // path to a config.json, or inline YAML mapping (stored as JSON text)
  bool model_config_inline = false;
  // data
  std::vector<std::string> train_data;  // shard files, directories or globs
  double val_fraction = 0.05;
  int64_t sequence_len = 256;
  std::string packing = "auto";      // auto | stream | packed | padded (data/packing.h)
  bool train_on_inputs = false;      // ignore the shards' loss mask: loss on every token
  // batch and length
  int64_t micro_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  int64_t max_steps = 1000;
  // optimizer and schedule
  double learning_rate = 3e-4;
  std::string lr_scheduler_type = "cosine";
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.0;
  double wsd_decay_ratio = 0.1;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  bool weight_decay_norms = false, weight_decay_biases = false, weight_decay_embeddings = false;
  // run
  uint64_t seed = 42;
  std::string output_dir = "runs/train";
  int64_t logging_steps = 10;
  int64_t eval_steps = 0;            // 0: evaluate only at the end
  int64_t eval_max_batches = 50;     // 0: all validation windows
  int64_t save_steps = 0;            // 0: save only at the end
  int64_t save_total_limit = 2;      // keep the last K checkpoints (0: keep all)
  // engine
  std::string device = "auto";       // auto | cpu | cuda
  std::string precision = "auto";    // auto (cpu: fp32, cuda: bf16) | fp32 | bf16
  bool master_weights = true;        // bf16: keep f32 master weights
  std::string grad_dtype = "f32";             // bf16: f32 | bf16 parameter gradients
  std::string optimizer_state_dtype = "f32";  // bf16: f32 | bf16 AdamW m and v
  bool stochastic_rounding = false;  // bf16: the optimizer's bf16 stores round stochastically
  RecipeOptions recipe_options() const {
    return {master_weights, grad_dtype, optimizer_state_dtype, stochastic_rounding};
  }
  bool cuda_graph = true;            // CUDA: capture the whole step once and replay it
  std::string recompute = "none";    // none | elementwise | block (model/transformer.h: Recompute)
  int64_t num_threads = 0;           // CPU threads; 0: all cores
  int64_t logits_chunk_tokens = 0;   // LM head + loss chunk; 0: automatic
  double init_std = 0.0;             // > 0 overrides config.json's initializer_range (from scratch)

  std::string source;                // the file it came from, for messages
  std::map<std::string, std::string> set_by_flag;  // key -> the "--set key=value" that gave its value

  // Where the value of the first of `keys` that a --set flag gave came from ("--set key=value"),
  // else the config file: what an error about those keys' values names.
  const std::string& source_of(std::initializer_list<const char*> keys) const {
    for (const char* key : keys)
      if (auto it = set_by_flag.find(key); it != set_by_flag.end()) return it->second;
    return source;
  }
};

struct ConfigKeyInfo {
  const char* name;
  const char* default_value;
  const char* help;
};
const std::vector<ConfigKeyInfo>& train_config_keys();

// Parses YAML text (source names the file in errors), then applies `overrides` ("key=value").
// Unknown keys are errors that suggest the closest known key; values are type-checked.
TrainConfig parse_train_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides = {});
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The architecture to train: from `model`'s config.json, or `model_config`.
ModelConfig resolve_model_config(const TrainConfig& config);

// Rethrows `error`, met while reading the path that config key `key` gave, prefixed with where that
// value came from (the config file or its --set flag); for a relative path that names nothing it
// adds where such paths are looked up.
[[noreturn]] void fail_reading_path(const TrainConfig& config, const char* key, const std::string& path,
                                    const std::exception& error);

// The known key closest to `key` by edit distance ("" when nothing is close).
std::string closest_key(const std::string& key, const std::vector<std::string>& known);

}  // namespace ingot
