// Hugging Face config.json <-> ModelConfig.
// Invariants:
// - parse_model_config() returns only configs Ingot can run exactly as transformers would: every
//   feature that changes the math and is not implemented (sliding windows, MLP biases, non-SiLU
//   activations, RoPE scalings other than llama3, partial rotary, attention dropout) is an error
//   naming the key, the value and the file, and so are keys that tell transformers to build or load
//   the model otherwise (is_causal false, transformers_weights, quantization_config,
//   per_layer_config). Other unknown keys are ignored (configs carry many that do not affect the
//   training math: use_cache, transformers_version, ...). pad_token_id is read: it
//   freezes a row of the input embedding, as nn.Embedding's padding_idx does in transformers.
// - Defaults follow the transformers config classes (LlamaConfig, Qwen2Config, Qwen3Config) where
//   a key is absent, so a config means the same model here as there.
// - model_config_to_json() writes every field parse_model_config() reads, so parse(to_json(c)) == c.
#include "ingot/model/config.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "ingot/core/error.h"
#include "ingot/io/json_util.h"

namespace ingot {
namespace {

using nlohmann::json;
using io::json_brief;
using io::json_type_name;

// Typed access to one JSON object; every error names the key, the value and the file. A key whose
// value is null counts as absent (transformers writes null for unset optional fields).
class JsonFields {
 public:
  JsonFields(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json* find(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string name(const char* key) const { return prefix_ + key; }

  [[noreturn]] void wrong_type(const char* key, const char* expected, const json& value) const {
    fail("key \"", name(key), "\" in ", source_, " must be ", expected, ", got ", json_type_name(value), " ",
         json_brief(value));
  }
  int64_t require_int(const char* key) const {
    if (!find(key)) fail("missing required key \"", name(key), "\" in ", source_);
    return get_int(key, 0);
  }
  int64_t get_int(const char* key, int64_t fallback) const {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_number_integer()) wrong_type(key, "an integer", *value);
    if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      wrong_type(key, "a 64-bit integer", *value);
    return value->get<int64_t>();
  }
  double get_number(const char* key, double fallback) const {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_number()) wrong_type(key, "a number", *value);
    return value->get<double>();
  }
  bool get_bool(const char* key, bool fallback) const {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_boolean()) wrong_type(key, "true or false", *value);
    return value->get<bool>();
  }
  std::string get_string(const char* key, const std::string& fallback) const {
    const json* value = find(key);
    if (!value) return fallback;
    if (!value->is_string()) wrong_type(key, "a string", *value);
    return value->get<std::string>();
  }

 private:
  const json& object_;
  std::string source_, prefix_;
};

// pad_token_id absent or null: distinct from any value config.json can hold in range.
constexpr int64_t kNoPadToken = std::numeric_limits<int64_t>::min();

const char* architecture_class(Architecture a) {
  switch (a) {
    case Architecture::llama: return "LlamaForCausalLM";
    case Architecture::qwen2: return "Qwen2ForCausalLM";
    case Architecture::qwen3: return "Qwen3ForCausalLM";
  }
  return "?";
}

// RoPE, resolved the way transformers 5 does it: the legacy "rope_scaling" dict wins over
// "rope_parameters"; rope_theta comes from that dict if there, else from the top level.
void parse_rope(const json& root, const JsonFields& fields, const std::string& source, ModelConfig* config) {
  const char* dict_key = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* value = fields.find(key);
    if (!value) continue;
    if (!value->is_object()) fields.wrong_type(key, "an object or null", *value);
    if (value->empty()) continue;
    dict_key = key;
    break;
  }
  config->rope_theta = fields.get_number("rope_theta", 10000.0);
  config->rope_scaling = RopeScaling{};
  if (!dict_key) return;

  const json& dict = root[dict_key];
  const JsonFields rope(dict, source, std::string(dict_key) + ".");
  config->rope_theta = rope.get_number("rope_theta", config->rope_theta);
  // A nested dict per layer type ({"full_attention": {...}, "sliding_attention": {...}}) only
  // appears with sliding windows, which are rejected elsewhere; treat any nesting as unsupported.
  for (const auto& [key, value] : dict.items())
    if (value.is_object())
      fail("key \"", dict_key, ".", key, "\" in ", source, ": per-layer-type RoPE parameters are not supported");
  const std::string type = rope.get_string("rope_type", rope.get_string("type", "default"));
  const double partial = rope.get_number("partial_rotary_factor", 1.0);
  if (partial != 1.0)
    fail("key \"", dict_key, ".partial_rotary_factor\" in ", source, " is ", partial,
         "; only full rotary embeddings (1.0) are supported");
  if (type == "default") return;
  if (type != "llama3")
    fail("unsupported RoPE scaling type \"", type, "\" (key \"", dict_key, "\") in ", source,
         "; supported: llama3 (or none)");
  RopeScaling& scaling = config->rope_scaling;
  scaling.enabled = true;
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"})
    if (!rope.find(key)) fail("missing key \"", dict_key, ".", key, "\" in ", source, " (required by llama3 RoPE)");
  scaling.factor = rope.get_number("factor", scaling.factor);
  scaling.low_freq_factor = rope.get_number("low_freq_factor", scaling.low_freq_factor);
  scaling.high_freq_factor = rope.get_number("high_freq_factor", scaling.high_freq_factor);
  // transformers 5 takes a top-level original_max_position_embeddings over the dict's (written for
  // Phi-3, whose configs keep it there, but applied to every llama3 config), and defaults it to
  // max_position_embeddings when neither has it.
  const bool top_level = fields.find("original_max_position_embeddings") != nullptr;
  scaling.original_max_position_embeddings =
      top_level ? fields.get_int("original_max_position_embeddings", 0)
                : rope.get_int("original_max_position_embeddings", config->max_position_embeddings);
  if (!(scaling.factor > 0)) fail("key \"", dict_key, ".factor\" in ", source, " must be > 0, got ", scaling.factor);
  if (!(scaling.low_freq_factor > 0) || !(scaling.high_freq_factor > scaling.low_freq_factor))
    fail("keys \"", dict_key, ".low_freq_factor\" (", scaling.low_freq_factor, ") and \"", dict_key,
         ".high_freq_factor\" (", scaling.high_freq_factor, ") in ", source, " must satisfy 0 < low < high");
  if (scaling.original_max_position_embeddings <= 0)
    fail("key \"", top_level ? "" : std::string(dict_key) + ".", "original_max_position_embeddings\" in ", source,
         " must be > 0, got ", scaling.original_max_position_embeddings);
}

}  // namespace

const std::vector<std::string>& model_config_keys() {
  static const std::vector<std::string> keys = {
      "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
      "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "initializer_range",
      "tie_word_embeddings", "attention_bias", "rope_theta", "rope_scaling", "rope_parameters", "bos_token_id",
      "eos_token_id", "dtype", "torch_dtype", "hidden_act", "mlp_bias", "use_sliding_window", "sliding_window",
      "max_window_layers", "layer_types", "original_max_position_embeddings",
      "attention_dropout", "partial_rotary_factor", "architectures", "use_cache", "pad_token_id", "transformers_version", "pretraining_tp"};
  return keys;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  const json root = io::parse_json(json_text, source, "model config");
  if (!root.is_object()) fail("model config ", source, " must be a JSON object, got ", json_type_name(root));
  const JsonFields fields(root, source);
  ModelConfig config;

  if (!fields.find("model_type")) fail("missing required key \"model_type\" in ", source);
  config.model_type = fields.get_string("model_type", "");
  if (config.model_type == "llama") config.architecture = Architecture::llama;
  else if (config.model_type == "qwen2") config.architecture = Architecture::qwen2;
  else if (config.model_type == "qwen3") config.architecture = Architecture::qwen3;
  else fail("unknown model_type \"", config.model_type, "\" in ", source, "; supported: llama, qwen2, qwen3");
  const Architecture arch = config.architecture;

  config.vocab_size = fields.require_int("vocab_size");
  config.hidden_size = fields.require_int("hidden_size");
  config.intermediate_size = fields.require_int("intermediate_size");
  config.num_hidden_layers = fields.require_int("num_hidden_layers");
  config.num_attention_heads = fields.require_int("num_attention_heads");
  // Upper bounds far above any real model keep a corrupt value from turning into an hours-long
  // per-layer allocation or an overflowing size (the largest open models: vocab ~256k, hidden
  // ~16k, MLP ~53k, 126 layers, 128 heads).
  const std::pair<const char*, int64_t> sizes[] = {{"vocab_size", int64_t{1} << 24}, {"hidden_size", int64_t{1} << 18},
                                                  {"intermediate_size", int64_t{1} << 20}, {"num_hidden_layers", 4096},
                                                  {"num_attention_heads", 4096}};
  for (const auto& [key, maximum] : sizes) {
    const int64_t v = fields.get_int(key, 0);
    if (v <= 0 || v > maximum) fail("key \"", key, "\" in ", source, " must be in [1, ", maximum, "], got ", v);
  }

  // LlamaConfig's default is num_attention_heads; Qwen2Config's and Qwen3Config's is 32, whatever
  // the heads (taken as num_attention_heads here, it built another model than transformers does).
  // (An explicit null is None there, which both classes take as num_attention_heads.)
  const bool kv_heads_given = root.contains("num_key_value_heads");
  config.num_key_value_heads = fields.get_int(
      "num_key_value_heads", arch == Architecture::llama || kv_heads_given ? config.num_attention_heads : 32);
  // Qwen3Config's default head_dim is 128, independent of hidden_size; the others derive it.
  const int64_t default_head_dim =
      arch == Architecture::qwen3 ? 128 : config.hidden_size / config.num_attention_heads;
  config.head_dim = fields.get_int("head_dim", default_head_dim);
  if (!fields.find("head_dim") && arch != Architecture::qwen3 && config.hidden_size % config.num_attention_heads != 0)
    fail("hidden_size (", config.hidden_size, ") in ", source, " is not a multiple of num_attention_heads (",
         config.num_attention_heads, ") and no head_dim is given");
  config.max_position_embeddings =
      fields.get_int("max_position_embeddings", arch == Architecture::llama ? 2048 : 32768);
  config.rms_norm_eps = fields.get_number("rms_norm_eps", 1e-6);
  config.initializer_range = fields.get_number("initializer_range", 0.02);
  config.tie_word_embeddings = fields.get_bool("tie_word_embeddings", false);
  config.attention_bias = arch == Architecture::qwen2 ? true : fields.get_bool("attention_bias", false);
  // transformers' Llama and Qwen3 put a bias on o_proj as well when attention_bias is true; Ingot's
  // blocks have q/k/v biases only (Qwen2's layout), so such a model would lose its o_proj bias.
  if (arch != Architecture::qwen2 && config.attention_bias)
    fail("key \"attention_bias\" in ", source, " is true; ", config.model_type,
         " attention with biases (q, k, v and o_proj, as transformers builds it) is not supported");
  config.qk_norm = arch == Architecture::qwen3;
  parse_rope(root, fields, source, &config);

  config.bos_token_id = fields.get_int("bos_token_id", -1);
  config.pad_token_id = fields.get_int("pad_token_id", kNoPadToken);
  if (const json* eos = fields.find("eos_token_id"); eos && eos->is_array()) {
    // Generation may stop on several ids; training needs one, the first (the primary EOS).
    for (const json& id : *eos) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0)
        fail("key \"eos_token_id\" in ", source, " must be an integer or a list of integers, got ", json_brief(*eos));
      config.eos_token_ids.push_back(id.get<int64_t>());
    }
    config.eos_token_id = config.eos_token_ids.empty() ? -1 : config.eos_token_ids[0];
  } else {
    config.eos_token_id = fields.get_int("eos_token_id", -1);
  }
  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  config.torch_dtype = fields.get_string("dtype", fields.get_string("torch_dtype", "bfloat16"));

  // Features that change the math and that Ingot does not implement.
  const std::string act = fields.get_string("hidden_act", "silu");
  if (act != "silu") fail("unsupported hidden_act \"", act, "\" in ", source, "; only \"silu\" is supported");
  if (fields.get_bool("mlp_bias", false))
    fail("key \"mlp_bias\" in ", source, " is true; MLP biases are not supported");
  // Sliding windows as Qwen2Config and Qwen3Config derive them when layer_types is absent: with
  // use_sliding_window and a non-null sliding_window (default 4096), layers from max_window_layers
  // (default 28) on slide. Where that leaves none, every layer is full attention, as in transformers.
  // LlamaConfig has no sliding window and never reads these keys.
  if (arch != Architecture::llama && fields.get_bool("use_sliding_window", false) && !fields.find("layer_types")) {
    const auto window = root.find("sliding_window");  // null here is None, not the default
    const bool no_window = window != root.end() && window->is_null();
    const int64_t first_sliding = fields.get_int("max_window_layers", 28);
    if (!no_window && first_sliding < config.num_hidden_layers)
      fail("key \"use_sliding_window\" in ", source, " is true and \"max_window_layers\" is ", first_sliding,
           ", so layers ", std::max<int64_t>(first_sliding, 0), " to ", config.num_hidden_layers - 1,
           " would use sliding-window attention, which is not supported");
  }
  if (const json* types = fields.find("layer_types")) {
    if (!types->is_array()) fields.wrong_type("layer_types", "a list of strings", *types);
    for (const json& t : *types)
      if (!t.is_string() || t.get<std::string>() != "full_attention")
        fail("key \"layer_types\" in ", source, " contains ", json_brief(t),
             "; only \"full_attention\" layers are supported");
  }
  if (const double dropout = fields.get_number("attention_dropout", 0.0); dropout != 0.0)
    fail("key \"attention_dropout\" in ", source, " is ", dropout, "; attention dropout is not supported");
  // Keys with which transformers builds or loads the model otherwise. Ignored, they trained another
  // model than the one the directory describes, without a word.
  if (const json* causal = fields.find("is_causal"); causal && *causal != json(true))
    fail("key \"is_causal\" in ", source, " is ", json_brief(*causal), "; only causal attention is supported");
  if (const json* weights = fields.find("transformers_weights");
      weights && *weights != json("model.safetensors") && *weights != json("model.safetensors.index.json"))
    fail("key \"transformers_weights\" in ", source, " names ", json_brief(*weights), " as the weights file; Ingot "
         "reads model.safetensors (or model.safetensors.index.json): rename the file, or remove the key");
  if (fields.find("quantization_config"))
    fail("key \"quantization_config\" in ", source, ": quantized checkpoints (and quantizing on load) are not "
         "supported; use the model's bf16 or f32 weights");
  if (fields.find("per_layer_config"))
    fail("key \"per_layer_config\" in ", source, ": per-layer settings are not supported");
  if (const json* types = fields.find("layer_types"); types && types->is_array() &&
                                                       int64_t(types->size()) != config.num_hidden_layers)
    fail("key \"layer_types\" in ", source, " lists ", types->size(), " layers, but num_hidden_layers is ",
         config.num_hidden_layers);
  if (const double partial = fields.get_number("partial_rotary_factor", 1.0); partial != 1.0)
    fail("key \"partial_rotary_factor\" in ", source, " is ", partial, "; only full rotary embeddings are supported");

  // Consistency.
  if (config.num_key_value_heads <= 0)
    fail("key \"num_key_value_heads\" in ", source, " must be > 0, got ", config.num_key_value_heads);
  if (config.num_attention_heads % config.num_key_value_heads != 0)
    fail("num_attention_heads (", config.num_attention_heads, ") in ", source,
         " is not a multiple of num_key_value_heads (", config.num_key_value_heads, ")",
         kv_heads_given ? "" : ", the default of transformers' " + std::string(arch == Architecture::qwen2 ? "Qwen2Config" : "Qwen3Config") +
                                   " where the key is absent: give num_key_value_heads");
  if (config.head_dim <= 0 || config.head_dim % 2 != 0 || config.head_dim > 4096)
    fail("head_dim in ", source, " must be positive, even (RoPE rotates pairs) and at most 4096, got ", config.head_dim,
         fields.find("head_dim") ? "" : " (derived as hidden_size / num_attention_heads)");
  if (config.max_position_embeddings <= 0)
    fail("key \"max_position_embeddings\" in ", source, " must be > 0, got ", config.max_position_embeddings);
  if (!(config.rms_norm_eps > 0)) fail("key \"rms_norm_eps\" in ", source, " must be > 0, got ", config.rms_norm_eps);
  // Below 1 the rotation frequencies grow past one radian a token, up to float overflow (1e-300
  // trained to a NaN loss that blamed the data); no model uses such a base.
  if (!(config.rope_theta >= 1 && std::isfinite(config.rope_theta)))
    fail("rope_theta in ", source, " must be a finite number >= 1 (models use 10000 to 1e6 or more), got ",
         config.rope_theta);
  if (!(config.initializer_range >= 0))
    fail("key \"initializer_range\" in ", source, " must be >= 0, got ", config.initializer_range);
  // nn.Embedding takes a padding_idx in [-V, V), a negative one from the end.
  if (config.pad_token_id != kNoPadToken) {
    if (config.pad_token_id < -config.vocab_size || config.pad_token_id >= config.vocab_size)
      fail("key \"pad_token_id\" in ", source, " is ", config.pad_token_id, ", outside the vocabulary of ",
           config.vocab_size);
    if (config.pad_token_id < 0) config.pad_token_id += config.vocab_size;
  } else {
    config.pad_token_id = -1;
  }
  if (config.bos_token_id < -1 || config.bos_token_id >= config.vocab_size)
    fail("key \"bos_token_id\" in ", source, " is ", config.bos_token_id, ", outside the vocabulary of ", config.vocab_size);
  if (config.eos_token_id < -1 || config.eos_token_id >= config.vocab_size)
    fail("key \"eos_token_id\" in ", source, " is ", config.eos_token_id, ", outside the vocabulary of ", config.vocab_size);
  for (const int64_t id : config.eos_token_ids)
    if (id >= config.vocab_size)
      fail("key \"eos_token_id\" in ", source, " holds ", id, ", outside the vocabulary of ", config.vocab_size);
  return config;
}

ModelConfig load_model_config(const std::string& path) {
  std::error_code ec;
  const std::string file =
      std::filesystem::is_directory(path, ec) ? (std::filesystem::path(path) / "config.json").string() : path;
  return parse_model_config(io::read_text_file(file, "model config"), file);
}

std::string model_config_to_json(const ModelConfig& c) {
  // ordered_json keeps the familiar transformers key order for people reading the file.
  nlohmann::ordered_json out;
  out["architectures"] = {architecture_class(c.architecture)};
  out["model_type"] = c.model_type;
  out["vocab_size"] = c.vocab_size;
  out["hidden_size"] = c.hidden_size;
  out["intermediate_size"] = c.intermediate_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_attention_heads"] = c.num_attention_heads;
  out["num_key_value_heads"] = c.num_key_value_heads;
  out["head_dim"] = c.head_dim;
  out["hidden_act"] = "silu";
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["rms_norm_eps"] = c.rms_norm_eps;
  out["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.enabled) {
    out["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", c.rope_scaling.factor},
                           {"low_freq_factor", c.rope_scaling.low_freq_factor},
                           {"high_freq_factor", c.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  } else {
    out["rope_scaling"] = nullptr;
  }
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  out["attention_bias"] = c.attention_bias;
  if (c.architecture == Architecture::llama) out["mlp_bias"] = false;
  if (c.architecture != Architecture::llama) {
    // Explicitly off: Qwen2Config/Qwen3Config default sliding_window to 4096, and transformers
    // 4.49-4.51 build their mask from it whatever use_sliding_window says.
    out["use_sliding_window"] = false;
    out["sliding_window"] = nullptr;
    out["max_window_layers"] = c.num_hidden_layers;
  }
  out["attention_dropout"] = 0.0;
  out["initializer_range"] = c.initializer_range;
  // null, not absent: LlamaConfig would otherwise default bos/eos to 1/2.
  out["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  out["pad_token_id"] = c.pad_token_id >= 0 ? json(c.pad_token_id) : json(nullptr);
  out["eos_token_id"] = !c.eos_token_ids.empty() ? json(c.eos_token_ids)
                        : c.eos_token_id >= 0   ? json(c.eos_token_id)
                                                : json(nullptr);
  out["use_cache"] = true;
  out["torch_dtype"] = c.torch_dtype;
  return out.dump(2) + "\n";
}

int64_t count_parameters(const ModelConfig& c) {
  const int64_t C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  int64_t per_layer = Hq * D * C + 2 * Hkv * D * C + C * Hq * D  // q, k, v, o
                      + 3 * C * F                                 // gate, up, down
                      + 2 * C;                                    // input and post-attention norms
  if (c.attention_bias) per_layer += Hq * D + 2 * Hkv * D;
  if (c.qk_norm) per_layer += 2 * D;
  const int64_t embeddings = V * C * (c.tie_word_embeddings ? 1 : 2);
  return embeddings + c.num_hidden_layers * per_layer + C;  // + final norm
}

int64_t count_matmul_parameters(const ModelConfig& c) {
  const int64_t C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t per_layer = 2 * Hq * D * C + 2 * Hkv * D * C + 3 * C * F;
  return c.num_hidden_layers * per_layer + V * C;  // the LM head counts whether or not it is tied
}

}  // namespace ingot
