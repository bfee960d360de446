#include "ingot/train/train_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include <glob.h>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "ingot/core/error.h"
#include "ingot/io/json_util.h"
#include "ingot/optim/lr_schedule.h"

namespace ingot {

const std::vector<ConfigKeyInfo>& train_config_keys() {
  static const std::vector<ConfigKeyInfo> keys = {
      {"model", "\"\"", "Hugging Face model directory to start from (config.json + safetensors), a checkpoint, or a run's output_dir (its newest checkpoint); exactly one of model and model_config is required"},
      {"model_config", "\"\"", "architecture for training from scratch: path to a config.json, or an inline mapping of its keys; exactly one of model and model_config is required"},
      {"train_data", "required", "token shards: files, directories or globs (string or list)"},
      {"val_fraction", "0.05", "share of sequences (packed and padded data: of documents) held out for validation, below 1"},
      {"sequence_len", "256", "tokens per training sequence (above the model's `max_position_embeddings` the run warns: RoPE reaches any position, but a pretrained model has not seen them)"},
      {"packing", "auto", "auto (packed for shards with a loss mask, else stream), stream, packed or padded"},
      {"train_on_inputs", "false", "ignore the shards' loss mask and train on every token"},
      {"micro_batch_size", "8", "sequences per forward/backward pass"},
      {"gradient_accumulation_steps", "1", "micro-batches per optimizer step"},
      {"max_steps", "1000", "optimizer steps to train"},
      {"learning_rate", "3e-4", "peak learning rate"},
      {"lr_scheduler_type", "cosine", "constant, linear, cosine or wsd (after linear warm-up)"},
      {"warmup_steps", "0", "linear warm-up steps from 0"},
      {"min_lr_ratio", "0.0", "floor of the decay as a fraction of learning_rate"},
      {"wsd_decay_ratio", "0.1", "wsd: final fraction of steps spent decaying"},
      {"weight_decay", "0.0",
       "decoupled AdamW weight decay (each weight times 1 − learning_rate × weight_decay a step, so their product "
       "must be below 1)"},
      {"adam_beta1", "0.9", "AdamW beta1"},
      {"adam_beta2", "0.999", "AdamW beta2"},
      {"adam_epsilon", "1e-8", "AdamW epsilon"},
      {"max_grad_norm", "1.0", "global-norm gradient clipping; 0 disables"},
      {"weight_decay_norms", "false", "apply weight decay to RMSNorm weights"},
      {"weight_decay_biases", "false", "apply weight decay to biases"},
      {"weight_decay_embeddings", "false", "apply weight decay to the input embedding"},
      {"seed", "42", "seed for initialisation and data order"},
      {"output_dir", "runs/train", "where checkpoints, metrics.jsonl and loss.svg go"},
      {"logging_steps", "10", "log a line and a metrics.jsonl record every N steps (and at every evaluation, the last step, a step with no trained targets and a stop by signal); tokens/s counts every row position (padding too) and leaves out evaluation and checkpoint saving"},
      {"eval_steps", "0", "validation loss every N steps; 0: only at the end"},
      {"eval_max_batches", "50", "validation micro-batches per evaluation; 0: all"},
      {"save_steps", "0", "checkpoint every N steps; 0: only at the end"},
      {"save_total_limit", "2", "keep the last K checkpoints (one more until the step after a save has trained soundly on it: docs/formats.md); 0: keep all"},
      {"device", "auto", "auto, cpu or cuda"},
      {"precision", "auto", "auto (cpu: fp32, cuda: bf16), fp32 or bf16"},
      {"master_weights", "true", "bf16: keep f32 master weights for the optimizer"},
      {"grad_dtype", "f32", "bf16: f32 or bf16 parameter gradients (bf16 sums micro-batches and LM-head chunks in bf16)"},
      {"optimizer_state_dtype", "f32", "bf16: f32 or bf16 AdamW moments (updated in f32, stored rounded to nearest, or stochastically with stochastic_rounding)"},
      {"stochastic_rounding", "false", "bf16: round the optimizer's bf16 stores (weights without master, bf16 moments) stochastically instead of to nearest"},
      {"cuda_graph", "true", "CUDA: capture the whole training step as one CUDA graph and replay it"},
      {"recompute", "none", "none; elementwise: recompute the RMSNorm, SwiGLU (and qk-norm/RoPE) outputs during backward instead of keeping them; or block: keep only each block's input and recompute the block's forward during backward"},
      {"num_threads", "0", "CPU threads; 0: all cores"},
      {"logits_chunk_tokens", "0", "tokens per LM-head + loss chunk; 0: automatic"},
      {"init_std", "0.0", "from scratch: std of the normal init; 0: config.json's initializer_range (refused with `model`)"},
  };
  return keys;
}

std::string closest_key(const std::string& key, const std::vector<std::string>& known) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = up;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& k : known) {
    const size_t d = distance(key, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  // Only suggest something plausibly meant: within a third of the key's length (at least 2 edits).
  return best_distance <= std::max<size_t>(2, key.size() / 3) ? best : "";
}

namespace {

// `where` names the node for errors ("config.yaml: model_config.rope_theta").
// An integer as people write it: decimal, no leading zero. YAML 1.1 (yaml-cpp) reads 010 as 8 and
// 0x10 as 16, so max_steps: 010 trained 8 steps.
void check_plain_integer(const std::string& text, const std::string& where) {
  const size_t digits = text.find_first_not_of("+-") == 1 ? 1 : 0;
  const bool plain = text.size() > digits &&
                     std::all_of(text.begin() + digits, text.end(), [](unsigned char ch) { return std::isdigit(ch); }) &&
                     (text[digits] != '0' || text.size() == digits + 1);
  if (!plain) fail(where, ": ", text, " is not a plain decimal integer (YAML would read it in another base); write it without a leading 0 or base prefix");
}

// The prefix of the YAML core schema's tags ("!!float" is "tag:yaml.org,2002:float").
const std::string kCoreTag = "tag:yaml.org,2002:";

// A YAML tag as the user wrote it: the core schema's "tag:yaml.org,2002:float" is "!!float".
std::string shown_tag(const std::string& tag) {
  return tag.rfind(kCoreTag, 0) == 0 ? "!!" + tag.substr(kCoreTag.size()) : tag;
}

// What a model_config may hold: HF config.json files nest a few levels and hold hundreds of values.
// The bounds stop a YAML alias that contains itself (`&a [*a]`: the recursion overflowed the stack)
// and an alias bomb (aliases of aliases, each level ten times the last: memory without end).
constexpr int kMaxYamlDepth = 64;
constexpr int64_t kMaxYamlNodes = 100000;

nlohmann::json yaml_to_json(const YAML::Node& node, const std::string& where, int depth, int64_t& nodes) {
  if (depth > kMaxYamlDepth)  // `where` is as deep: its start says which key
    fail(where.substr(0, 160), "...: nested more than ", kMaxYamlDepth, " levels deep (a YAML alias that contains itself?)");
  if (++nodes > kMaxYamlNodes)
    fail(where, ": more than ", kMaxYamlNodes, " values (YAML aliases repeated within aliases?)");
  // A mapping or a list may carry only its own core tag, as a scalar only one that fits it.
  const std::string& own = node.Tag();
  const std::string kind = node.IsMap() ? "map" : node.IsSequence() ? "seq" : "";
  if (!kind.empty() && !own.empty() && own != "?" && own != "!" && own != kCoreTag + kind)
    fail(where, ": the ", node.IsMap() ? "mapping" : "list", " carries the YAML tag ", shown_tag(own),
         ", which does not fit it (!!", kind, " does)");
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& item : node) {
        if (!item.first.IsScalar()) fail(where, ": keys must be plain names");
        const std::string key = item.first.Scalar();
        if (object.contains(key)) fail(where, ": key \"", key, "\" is given twice");
        object[key] = yaml_to_json(item.second, where + "." + key, depth + 1, nodes);
      }
      return object;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& item : node)
        array.push_back(yaml_to_json(item, where + "[" + std::to_string(array.size()) + "]", depth + 1, nodes));
      return array;
    }
    case YAML::NodeType::Scalar: {
      const std::string text = node.Scalar();
      const std::string& tag = node.Tag();
      if (tag == "!" || tag == kCoreTag + "str") return text;  // quoted or !!str: a string
      // Another explicit tag must name what the value reads as, as for the top-level keys: !foo
      // was ignored, and !!int on a real read as the real.
      const bool tagged = !tag.empty() && tag != "?";
      bool b;
      int64_t i;
      double d;
      const bool is_bool = YAML::convert<bool>::decode(node, b), is_int = YAML::convert<int64_t>::decode(node, i);
      const bool is_real = YAML::convert<double>::decode(node, d);
      if (tagged && !(tag == kCoreTag + "bool" && is_bool) && !(tag == kCoreTag + "int" && is_int && !is_bool) &&
          !(tag == kCoreTag + "float" && is_real && !is_bool))
        fail(where, ": the value ", text, " carries the YAML tag ", shown_tag(tag), ", which does not fit it (!!str, !!bool, "
             "!!int and !!float are read)");
      if (is_bool) return b;  // y/n, yes/no and on/off too, as at the top level
      if (is_int && tag != kCoreTag + "float") {
        check_plain_integer(text, where);
        return i;
      }
      if (is_real) {
        // JSON has no inf or nan: they would turn into null and then into the key's default.
        if (!std::isfinite(d)) fail(where, " must be a finite number, got ", text);
        return d;
      }
      return text;
    }
    default:
      return nullptr;
  }
}

std::string format_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Sets one key from its YAML value; `where` (the config file, or "--set key=value") prefixes errors.
struct Setter {
  std::function<void(TrainConfig&, const YAML::Node&, const std::string& where)> apply;
};

template <typename T>
T scalar_as(const YAML::Node& node, const std::string& key, const std::string& source, const char* type_name) {
  // `key:` with nothing after it, or null (`--set key=` and `--set key=~` arrive as "", which
  // clears a path): it was reported as the value "".
  if (node.IsNull()) fail(source, ": key \"", key, "\" must be ", type_name, ", got no value (null)");
  if (!node.IsScalar()) fail(source, ": key \"", key, "\" must be ", type_name);
  // A quoted or !!str scalar is a string, as in an inline model_config: "2" is not a number.
  if constexpr (!std::is_same_v<T, std::string>) {
    if (node.Tag() == "!" || node.Tag() == kCoreTag + "str")
      fail(source, ": key \"", key, "\" must be ", type_name, ", got the string \"", node.Scalar(), "\"");
    if (node.Scalar().empty()) fail(source, ": key \"", key, "\" must be ", type_name, ", got no value (null)");
  }
  // Any other explicit tag must be the key's own YAML type (an integer may stand for a real):
  // !foo was ignored, and !!float 3 read as the integer 3.
  const std::string& tag = node.Tag();
  if (!tag.empty() && tag != "?" && tag != "!" && tag != kCoreTag + "str") {  // "": a node made in code
    const bool fits = std::is_same_v<T, bool>       ? tag == kCoreTag + "bool"
                      : std::is_integral_v<T>       ? tag == kCoreTag + "int"
                      : std::is_floating_point_v<T> ? tag == kCoreTag + "float" || tag == kCoreTag + "int"
                                                    : false;
    if (!fits) fail(source, ": key \"", key, "\" must be ", type_name, ", and its value carries the YAML tag ", shown_tag(tag));
  }
  try {
    const T value = node.as<T>();
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      check_plain_integer(node.Scalar(), source + ": key \"" + key + "\"");
    return value;
  } catch (const YAML::Exception&) {
    fail(source, ": key \"", key, "\" must be ", type_name, ", got \"", node.Scalar(), "\"");
  }
}

std::map<std::string, Setter> make_setters() {
  std::map<std::string, Setter> s;
  auto str = [&](const char* key, std::string TrainConfig::*field) {
    s[key] = {[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
      c.*field = scalar_as<std::string>(n, key, where, "a string");
    }};
  };
  // A path with a control character (a NUL cut "dir\0junk" to "dir" in the system calls; a newline
  // from a YAML block scalar made a folder named "dir\n") is a mistake in the config.
  auto path_of = [](const YAML::Node& n, const char* key, const std::string& where, const char* expected) {
    std::string value = scalar_as<std::string>(n, key, where, expected);
    for (size_t i = 0; i < value.size(); ++i)
      if (static_cast<unsigned char>(value[i]) < 0x20 || value[i] == 0x7f)
        fail(where, ": key \"", key, "\": the path holds a control character (byte ", int(static_cast<unsigned char>(value[i])),
             ") at offset ", i);
    return value;
  };
  auto path = [&](const char* key, std::string TrainConfig::*field) {
    s[key] = {[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
      c.*field = path_of(n, key, where, "a string");
    }};
  };
  // Upper bounds keep absurd values from reaching allocations (a crash or an hours-long
  // allocation instead of a message); they sit far above any real run.
  auto integer = [&](const char* key, int64_t TrainConfig::*field, int64_t minimum,
                     int64_t maximum = std::numeric_limits<int64_t>::max()) {
    s[key] = {[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
      const int64_t v = scalar_as<int64_t>(n, key, where, "an integer");
      if (v < minimum || v > maximum)
        fail(where, ": key \"", key, "\" must be ", maximum == std::numeric_limits<int64_t>::max()
                 ? ">= " + std::to_string(minimum)
                 : "between " + std::to_string(minimum) + " and " + std::to_string(maximum), ", got ", v);
      c.*field = v;
    }};
  };
  auto real = [&](const char* key, double TrainConfig::*field, double minimum,
                  double maximum = std::numeric_limits<double>::max()) {
    s[key] = {[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
      const double v = scalar_as<double>(n, key, where, "a number");
      if (!(v >= minimum && v <= maximum))  // also refuses nan and inf
        fail(where, ": key \"", key, "\" must be a finite number ",
             maximum == std::numeric_limits<double>::max() ? ">= " + format_number(minimum)
                                                           : "in [" + format_number(minimum) + ", " + format_number(maximum) + "]",
             ", got ", n.Scalar());
      c.*field = v;
    }};
  };
  auto boolean = [&](const char* key, bool TrainConfig::*field) {
    s[key] = {[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
      c.*field = scalar_as<bool>(n, key, where, "true or false");
    }};
  };
  path("model", &TrainConfig::model);
  s["model_config"] = {[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
    if (n.IsMap()) {
      int64_t nodes = 0;
      const nlohmann::json config = yaml_to_json(n, where + ": model_config", 0, nodes);
      // An empty value reads as null, and a null as the key's default (rms_norm_eps: with the value
      // forgotten trained with 1e-6): only keys whose null means something may hold one.
      static const std::set<std::string> nullable = {"rope_scaling", "rope_parameters", "bos_token_id", "eos_token_id",
                                                     "pad_token_id", "sliding_window", "max_window_layers", "layer_types"};
      for (const auto& [key, value] : config.items())
        if (value.is_null() && !nullable.contains(key))
          fail(where, ": model_config key \"", key, "\" has no value; remove the key to take its default");
      c.model_config = io::dump_json(config);  // a value that is not UTF-8 is then named by its check
      c.model_config_inline = true;
    } else {
      c.model_config = path_of(n, "model_config", where, "a path or a mapping");
      c.model_config_inline = false;
    }
  }};
  s["train_data"] = {[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
    c.train_data.clear();
    if (n.IsSequence()) {
      for (const auto& item : n) c.train_data.push_back(path_of(item, "train_data", where, "a list of paths"));
    } else {
      c.train_data.push_back(path_of(n, "train_data", where, "a path or a list of paths"));
    }
  }};
  real("val_fraction", &TrainConfig::val_fraction, 0.0);
  integer("sequence_len", &TrainConfig::sequence_len, 1, int64_t{1} << 24);
  str("packing", &TrainConfig::packing);
  boolean("train_on_inputs", &TrainConfig::train_on_inputs);
  integer("micro_batch_size", &TrainConfig::micro_batch_size, 1, int64_t{1} << 20);
  integer("gradient_accumulation_steps", &TrainConfig::gradient_accumulation_steps, 1, int64_t{1} << 20);
  integer("max_steps", &TrainConfig::max_steps, 1);
  real("learning_rate", &TrainConfig::learning_rate, 0.0);
  str("lr_scheduler_type", &TrainConfig::lr_scheduler_type);
  integer("warmup_steps", &TrainConfig::warmup_steps, 0);
  real("min_lr_ratio", &TrainConfig::min_lr_ratio, 0.0, 1.0);
  real("wsd_decay_ratio", &TrainConfig::wsd_decay_ratio, 0.0, 1.0);
  real("weight_decay", &TrainConfig::weight_decay, 0.0);
  real("adam_beta1", &TrainConfig::adam_beta1, 0.0);
  real("adam_beta2", &TrainConfig::adam_beta2, 0.0);
  real("adam_epsilon", &TrainConfig::adam_epsilon, 0.0);
  real("max_grad_norm", &TrainConfig::max_grad_norm, 0.0);
  boolean("weight_decay_norms", &TrainConfig::weight_decay_norms);
  boolean("weight_decay_biases", &TrainConfig::weight_decay_biases);
  boolean("weight_decay_embeddings", &TrainConfig::weight_decay_embeddings);
  s["seed"] = {[=](TrainConfig& c, const YAML::Node& n, const std::string& where) {
    c.seed = scalar_as<uint64_t>(n, "seed", where, "a non-negative integer");
  }};
  path("output_dir", &TrainConfig::output_dir);
  integer("logging_steps", &TrainConfig::logging_steps, 1);
  integer("eval_steps", &TrainConfig::eval_steps, 0);
  integer("eval_max_batches", &TrainConfig::eval_max_batches, 0);
  integer("save_steps", &TrainConfig::save_steps, 0);
  integer("save_total_limit", &TrainConfig::save_total_limit, 0);
  str("device", &TrainConfig::device);
  str("precision", &TrainConfig::precision);
  boolean("master_weights", &TrainConfig::master_weights);
  str("grad_dtype", &TrainConfig::grad_dtype);
  str("optimizer_state_dtype", &TrainConfig::optimizer_state_dtype);
  boolean("stochastic_rounding", &TrainConfig::stochastic_rounding);
  boolean("cuda_graph", &TrainConfig::cuda_graph);
  str("recompute", &TrainConfig::recompute);
  integer("num_threads", &TrainConfig::num_threads, 0, 1024);
  integer("logits_chunk_tokens", &TrainConfig::logits_chunk_tokens, 0);
  real("init_std", &TrainConfig::init_std, 0.0);
  return s;
}

// Keys of Hugging Face TrainingArguments (and other trainers) that people carry over, with what
// Ingot calls them: edit distance finds typos, not these.
const char* key_from_another_trainer(const std::string& key) {
  static const std::map<std::string, const char*> hints = {
      {"num_train_epochs", "Ingot counts steps: set max_steps (one epoch is the number of train windows or rows the "
                           "log's data line gives, divided by micro_batch_size × gradient_accumulation_steps)"},
      {"epochs", "Ingot counts steps: set max_steps"},
      {"max_epochs", "Ingot counts steps: set max_steps"},
      {"per_device_train_batch_size", "Ingot's key is micro_batch_size"},
      {"batch_size", "Ingot's keys are micro_batch_size and gradient_accumulation_steps"},
      {"train_batch_size", "Ingot's keys are micro_batch_size and gradient_accumulation_steps"},
      {"warmup_ratio", "Ingot's key is warmup_steps (a number of steps)"},
      {"lr", "Ingot's key is learning_rate"},
      {"max_seq_length", "Ingot's key is sequence_len"},
      {"max_length", "Ingot's key is sequence_len"},
      {"block_size", "Ingot's key is sequence_len"},
      {"seq_len", "Ingot's key is sequence_len"},
      {"model_name_or_path", "Ingot's key is model (a local directory)"},
      {"train_file", "Ingot's key is train_data (shards from ingot prepare)"},
      {"dataset", "Ingot's key is train_data (shards from ingot prepare)"},
      {"gradient_checkpointing", "Ingot's key is recompute (none, elementwise or block)"},
      {"bf16", "Ingot's key is precision (bf16 or fp32)"},
      {"fp16", "Ingot's key is precision (bf16 or fp32)"},
      {"save_strategy", "Ingot saves every save_steps steps"},
      {"eval_strategy", "Ingot evaluates every eval_steps steps"},
      {"evaluation_strategy", "Ingot evaluates every eval_steps steps"},
      {"lr_scheduler", "Ingot's key is lr_scheduler_type"},
      {"optim", "Ingot trains with AdamW; its keys are adam_beta1, adam_beta2, adam_epsilon and weight_decay"},
  };
  const auto it = hints.find(key);
  return it == hints.end() ? nullptr : it->second;
}

void apply_key(TrainConfig& config, const std::map<std::string, Setter>& setters, const std::string& key,
               const YAML::Node& value, const std::string& where) {
  auto it = setters.find(key);
  if (it == setters.end()) {
    if (const char* hint = key_from_another_trainer(key)) fail(where, ": unknown key \"", key, "\"; ", hint);
    std::vector<std::string> known;
    for (const auto& [name, setter] : setters) known.push_back(name);
    const std::string suggestion = closest_key(key, known);
    fail(where, ": unknown key \"", key, "\"",
         suggestion.empty() ? std::string("; see docs/config.md for the keys") : "; did you mean \"" + suggestion + "\"?");
  }
  it->second.apply(config, value, where);
}

// A message about a key names where its value came from: the --set flag if one gave it, else the
// config file.
void validate(const TrainConfig& c) {
  if (c.model.empty() == c.model_config.empty())
    fail(c.source_of({"model", "model_config"}),
         ": set exactly one of \"model\" (a Hugging Face model, a checkpoint or a run directory) or \"model_config\" (train from scratch)");
  // It did nothing to the loaded weights, but rewrote initializer_range in every checkpoint.
  if (!c.model.empty() && c.init_std > 0)
    fail(c.source_of({"init_std"}), ": key \"init_std\" sets the initialisation of a model trained from scratch (model_config), "
         "but \"model\" loads ", c.model, " from its weights; remove init_std");
  if (c.train_data.empty()) fail(c.source_of({"train_data"}), ": \"train_data\" is required (token shards made by `ingot prepare`)");
  for (const std::string& entry : c.train_data)
    if (entry.empty()) fail(c.source_of({"train_data"}), ": a \"train_data\" entry is empty");
  if (c.val_fraction >= 1.0) fail(c.source_of({"val_fraction"}), ": key \"val_fraction\" must be below 1, got ", c.val_fraction);
  try {
    validate_lr_schedule_type(c.lr_scheduler_type);
  } catch (const Error& e) {
    fail(c.source_of({"lr_scheduler_type"}), ": ", e.what());
  }
  if (c.packing != "auto" && c.packing != "stream" && c.packing != "packed" && c.packing != "padded")
    fail(c.source_of({"packing"}), ": key \"packing\" must be auto, stream, packed or padded, got \"", c.packing, "\"");
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda")
    fail(c.source_of({"device"}), ": key \"device\" must be auto, cpu or cuda, got \"", c.device, "\"");
  if (c.recompute != "none" && c.recompute != "elementwise" && c.recompute != "block")
    fail(c.source_of({"recompute"}), ": key \"recompute\" must be none, elementwise or block, got \"", c.recompute, "\"");
  if (c.precision != "auto" && c.precision != "fp32" && c.precision != "bf16")
    fail(c.source_of({"precision"}), ": key \"precision\" must be auto, fp32 or bf16, got \"", c.precision, "\"");
  if (const RecipeOptionProblem problem = find_recipe_option_problem(c.recipe_options(), c.precision); problem.key)
    fail(c.source_of({problem.key}), ": ", problem.message);
  // AdamW's decay multiplies each weight by 1 - lr * weight_decay a step: at 1 or more the weights
  // are zeroed or flip sign at the peak learning rate, whatever the gradients say.
  if (c.learning_rate * c.weight_decay >= 1.0)
    fail(c.source_of({"weight_decay", "learning_rate"}), ": learning_rate x weight_decay = ", c.learning_rate, " x ",
         c.weight_decay, " is ", c.learning_rate * c.weight_decay,
         ", at least 1: AdamW's decay (each weight times 1 - learning_rate x weight_decay a step) would zero the weights "
         "or flip their sign; usual values are about 1e-4 x 0.1");
  if (c.adam_beta1 >= 1.0) fail(c.source_of({"adam_beta1"}), ": key \"adam_beta1\" must be below 1, got ", c.adam_beta1);
  if (c.adam_beta2 >= 1.0) fail(c.source_of({"adam_beta2"}), ": key \"adam_beta2\" must be below 1, got ", c.adam_beta2);
  // At 0 (or below f32's smallest normal number, which rounds to 0 or loses precision), a weight
  // whose gradient is exactly 0, such as an unused token's embedding row, updates by 0 / 0.
  if (c.adam_epsilon < double(std::numeric_limits<float>::min()))
    fail(c.source_of({"adam_epsilon"}), ": key \"adam_epsilon\" must be at least ", std::numeric_limits<float>::min(),
         " (f32's smallest normal number), got ", c.adam_epsilon, ": at 0 a weight with a zero gradient updates by 0/0");
  if (c.output_dir.empty()) fail(c.source_of({"output_dir"}), ": key \"output_dir\" must not be empty");
  if (c.micro_batch_size * c.sequence_len > kMaxTokensPerStep / c.gradient_accumulation_steps)
    fail(c.source_of({"micro_batch_size", "sequence_len", "gradient_accumulation_steps"}),
         ": micro_batch_size x sequence_len x gradient_accumulation_steps = ", c.micro_batch_size, " x ",
         c.sequence_len, " x ", c.gradient_accumulation_steps, " tokens a step is above the limit of ", kMaxTokensPerStep);
}

}  // namespace

TrainConfig parse_train_config(const std::string& yaml_text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  TrainConfig config;
  config.source = source;
  const auto setters = make_setters();
  YAML::Node root;
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(yaml_text);
    if (documents.size() > 1)
      fail(source, ": holds ", documents.size(), " YAML documents (separated by ---); a config is one mapping");
    if (!documents.empty()) root = documents.front();
  } catch (const YAML::ParserException& e) {
    fail(source, ": YAML syntax error at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg);
  }
  if (root.IsDefined() && !root.IsNull()) {
    if (!root.IsMap()) fail(source, ": the config must be a mapping of key: value");
    std::set<std::string> seen;
    for (const auto& item : root) {
      if (!item.first.IsScalar()) fail(source, ": keys must be plain names");
      const std::string key = item.first.Scalar();
      if (!seen.insert(key).second) fail(source, ": key \"", key, "\" is given twice");
      apply_key(config, setters, key, item.second, source);
    }
  }
  for (const std::string& override_text : overrides) {
    const size_t eq = override_text.find('=');
    if (eq == std::string::npos || eq == 0) fail("--set \"", override_text, "\": expected key=value");
    const std::string key = override_text.substr(0, eq);
    YAML::Node value;
    try {
      // As the file: one document (Load kept the first of "2\n---\n5" and dropped the rest).
      const std::vector<YAML::Node> documents = YAML::LoadAll(override_text.substr(eq + 1));
      if (documents.size() > 1)
        fail("--set ", key, ": the value holds ", documents.size(), " YAML documents (separated by ---); give one value");
      if (!documents.empty()) value = documents.front();
    } catch (const YAML::ParserException& e) {
      fail("--set ", key, ": cannot parse value \"", override_text.substr(eq + 1), "\": ", e.msg);
    }
    if (value.IsNull()) value = YAML::Node(std::string());
    apply_key(config, setters, key, value, "--set " + override_text);
    config.set_by_flag[key] = "--set " + override_text;
  }
  validate(config);
  return config;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  TrainConfig config = parse_train_config(io::read_text_file(path, "config file"), path, overrides);
  // A relative path that names nothing from the current directory is taken from the config
  // file's directory when it names something there. A train_data glob "names something" when it
  // matches a file: it is expanded only later, by the data loader.
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  auto names_something = [](const std::filesystem::path& p) {
    const std::string s = p.string();
    if (s.find_first_of("*?[") == std::string::npos) return std::filesystem::exists(p);
    glob_t matches{};
    const bool any = ::glob(s.c_str(), 0, nullptr, &matches) == 0 && matches.gl_pathc > 0;
    ::globfree(&matches);
    return any;
  };
  auto rebase = [&](std::string& p) {
    if (!p.empty() && std::filesystem::path(p).is_relative() && !names_something(p) && names_something(base / p))
      p = (base / p).string();
  };
  rebase(config.model);
  if (!config.model_config_inline) rebase(config.model_config);
  for (std::string& p : config.train_data) rebase(p);
  return config;
}

ModelConfig resolve_model_config(const TrainConfig& c) {
  ModelConfig model;
  if (!c.model.empty()) model = load_model_config(c.model);
  else if (c.model_config_inline) {
    const std::string source = c.source_of({"model_config"}) + " (model_config)";
    const nlohmann::json inline_config = nlohmann::json::parse(c.model_config);
    const std::vector<std::string>& known = model_config_keys();
    for (const auto& [key, value] : inline_config.items()) {
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      const std::string suggestion = closest_key(key, known);
      fail(source, ": unknown key \"", key, "\"",
           suggestion.empty() ? std::string("; docs/formats.md lists the keys") : "; did you mean \"" + suggestion + "\"?");
    }
    model = parse_model_config(c.model_config, source);
  }
  else {
    try {
      model = load_model_config(c.model_config);
    } catch (const Error& e) {
      fail_reading_path(c, "model_config", c.model_config, e);
    }
  }
  if (c.init_std > 0) model.initializer_range = c.init_std;  // from scratch only (validate)
  return model;
}

void fail_reading_path(const TrainConfig& c, const char* key, const std::string& path, const std::exception& error) {
  std::error_code ec;
  const bool unfound_relative = std::filesystem::path(path).is_relative() && !std::filesystem::exists(path, ec) && !ec;
  fail(c.source_of({key}), ": ", key, ": ", error.what(),
       unfound_relative ? " (a relative path is looked up from the current directory, then from the config file's folder)" : "");
}

}  // namespace ingot
