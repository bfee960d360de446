// ModelConfig: the architecture, read from a Hugging Face config.json. Invariant after
// load_model_config(): every field is validated and consistent (head counts divide, dims > 0);
// anything Ingot does not support is rejected there with an error naming the key and value.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ingot {

enum class Architecture { llama, qwen2, qwen3 };

struct RopeScaling {             // rope_scaling of type "llama3"; absent when !enabled
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture architecture = Architecture::llama;
  std::string model_type = "llama";   // as in config.json
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;             // C
  int64_t intermediate_size = 0;       // F
  int64_t num_hidden_layers = 0;       // L
  int64_t num_attention_heads = 0;     // Hq
  int64_t num_key_value_heads = 0;     // Hkv (defaults to Hq)
  int64_t head_dim = 0;                // D (defaults to C / Hq)
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;         // q/k/v biases (always true for qwen2)
  bool qk_norm = false;                // per-head RMSNorm on q and k (qwen3)
  double initializer_range = 0.02;     // std of the normal init when training from scratch
  int64_t bos_token_id = -1, eos_token_id = -1;  // -1: not set
  // nn.Embedding's padding_idx in transformers' Llama and Qwen models: that row of the input
  // embedding gets no gradient from the lookup, and is zero when initialised from scratch. -1: none
  // (a negative pad_token_id in config.json counts from the end, as torch reads it).
  int64_t pad_token_id = -1;
  // eos_token_id given as a list (Llama 3 Instruct: end of text, eom and eot): all of them, written
  // back as read so that generation stops on each; eos_token_id is the first. Empty otherwise.
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype = "bfloat16";          // as read; a written config.json names its own weights' dtype
};

// Reads and validates MODEL_DIR/config.json (or a path to the json itself).
ModelConfig load_model_config(const std::string& path);
// Parses config.json text; `source` names the file in error messages.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

// The top-level keys parse_model_config reads (or checks for unsupported features), plus the
// transformers bookkeeping keys export writes. A config.json may hold others (transformers writes
// many); a model_config written inline in a training config may not: there, another key is a typo.
const std::vector<std::string>& model_config_keys();

// Serialises to a config.json that transformers loads back into the same architecture.
std::string model_config_to_json(const ModelConfig& config);

// Counts for `ingot info` and the MFU formula.
int64_t count_parameters(const ModelConfig& config);            // all trainable parameters
int64_t count_matmul_parameters(const ModelConfig& config);     // weights entering a matmul, LM head in, input embedding out

}  // namespace ingot
