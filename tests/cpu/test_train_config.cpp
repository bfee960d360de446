// TrainConfig parsing: defaults, types, overrides, suggestions, and docs/config.md completeness.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "ingot/core/env.h"
#include "ingot/core/error.h"
#include "ingot/ops/cuda/attention_cudnn.h"  // plain C++: the split arithmetic only
#include "ingot/optim/adamw.h"
#include "ingot/optim/lr_schedule.h"
#include "ingot/recipe/recipe.h"
#include "ingot/train/bench.h"
#include "ingot/train/memory_plan.h"
#include "ingot/train/train_config.h"
#include "ingot/train/trainer.h"
#include "test_util.h"

using namespace ingot;

static const char* kMinimal = "model_config: cfg.json\ntrain_data: data\n";

// The message of the ingot::Error that fn throws, or "no error".
static std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

TEST(TrainConfig, DefaultsAndOverrides) {
  const TrainConfig c = parse_train_config(kMinimal, "x.yaml", {"learning_rate=1e-3", "train_data=[a, b]"});
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-3);
  EXPECT_EQ(c.train_data, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.micro_batch_size, 8);
  EXPECT_EQ(c.lr_scheduler_type, "cosine");
}

// Relative model, model_config and train_data paths (globs included) that name nothing from the
// current directory come from the config file's directory; those that do stay as written.
TEST(TrainConfig, RelativePathsFallBackToTheConfigFilesDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = test::temp_dir("TrainConfigRelative");
  fs::create_directories(dir / "shards");
  fs::create_directories(dir / "elsewhere");
  for (const char* name : {"shards/train-00000.bin", "shards/train-00001.bin", "model.json"}) std::ofstream(dir / name) << "x";
  std::ofstream(dir / "train.yaml") << "model_config: model.json\ntrain_data: [shards/*.bin, shards, shards/train-00001.bin, "
                                       "missing/*.bin]\n";
  // From a directory where none of the relative paths resolve; the guard restores the working
  // directory even when loading throws, so the tests after this one are unaffected.
  struct WorkingDirectory {
    fs::path saved = fs::current_path();
    explicit WorkingDirectory(const fs::path& to) { fs::current_path(to); }
    ~WorkingDirectory() { fs::current_path(saved); }
  };
  TrainConfig c;
  {
    WorkingDirectory elsewhere(dir / "elsewhere");
    c = load_train_config((dir / "train.yaml").string(), {});
  }
  EXPECT_EQ(c.model_config, (dir / "model.json").string());
  EXPECT_EQ(c.train_data, (std::vector<std::string>{(dir / "shards/*.bin").string(), (dir / "shards").string(),
                                                     (dir / "shards/train-00001.bin").string(), "missing/*.bin"}));
  fs::remove_all(dir);
}

TEST(TrainConfig, InlineModelConfig) {
  const TrainConfig c = parse_train_config(
      "model_config:\n  model_type: qwen3\n  vocab_size: 64\n  hidden_size: 32\n  intermediate_size: 40\n"
      "  num_hidden_layers: 1\n  num_attention_heads: 4\n  num_key_value_heads: 4\n  head_dim: 16\ntrain_data: d\n", "x.yaml");
  const ModelConfig m = resolve_model_config(c);
  EXPECT_EQ(m.architecture, Architecture::qwen3);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_TRUE(m.qk_norm);
  // A value that is not UTF-8 is named by the key's own check (it was a bare JSON library error).
  const TrainConfig latin1 = parse_train_config("model_config:\n  model_type: \"qwen\xe9\"\n  vocab_size: 64\ntrain_data: d\n", "x.yaml");
  try {
    resolve_model_config(latin1);
    ADD_FAILURE() << "model_type \"qwen\\xe9\" was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model_type \"qwen\xef\xbf\xbd\" in x.yaml"), std::string::npos) << e.what();
  }
}

// A YAML alias that contains itself inside model_config overflowed the stack (a segfault), and
// aliases of aliases (each level ten times the last) ran on without bound in memory: both are
// refused, naming model_config, in the file and in --set.
TEST(TrainConfig, SelfContainingAndExplodingAliasesAreRefused) {
  auto message = [](const std::string& yaml, std::vector<std::string> overrides = {}) {
    try {
      resolve_model_config(parse_train_config(yaml, "x.yaml", overrides));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string cycle = "model_config: &a {model_type: llama, vocab_size: 64, architectures: [*a]}\ntrain_data: d\n";
  EXPECT_NE(message(cycle).find("x.yaml: model_config.architectures[0]"), std::string::npos) << message(cycle);
  EXPECT_NE(message(cycle).find("levels deep (a YAML alias that contains itself?)"), std::string::npos);
  const std::string set_cycle = message("train_data: d\n", {"model_config={model_type: llama, extra: &a [*a]}"});
  EXPECT_NE(set_cycle.find("levels deep"), std::string::npos) << set_cycle;
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 7; ++i) {
    bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) bomb += std::string(k ? ", " : "") + "*a" + std::to_string(i - 1);
    bomb += "]\n";
  }
  // 10^7 values under model_config.architectures; the top-level aN keys are unknown, so keep them inside.
  std::string nested = "model_config:\n  model_type: llama\n  vocab_size: 64\n  architectures:\n";
  std::istringstream lines(bomb);
  for (std::string line; std::getline(lines, line);) nested += "    - " + line.substr(line.find(':') + 2) + "\n";
  nested += "train_data: d\n";
  EXPECT_NE(message(nested).find("more than 100000 values (YAML aliases repeated within aliases?)"), std::string::npos)
      << message(nested).substr(0, 400);
}

TEST(TrainConfig, ErrorsNameKeyAndValue) {
  auto message = [](const std::string& yaml, std::vector<std::string> overrides = {}) {
    try {
      parse_train_config(yaml, "bad.yaml", overrides);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(std::string(kMinimal) + "max_step: 3\n").find("did you mean \"max_steps\""), std::string::npos);
  // A quoted number is a string, as in an inline model_config.
  EXPECT_NE(message(std::string(kMinimal), {"max_steps=\"2\""}).find("key \"max_steps\" must be an integer, got the string \"2\""),
            std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "learning_rate: '1e-3'\n").find("got the string \"1e-3\""), std::string::npos);
  // YAML 1.1 reads 010 as 8 and 0x10 as 16: such integers are refused, here and in model_config.
  EXPECT_NE(message(std::string(kMinimal) + "max_steps: 010\n").find("bad.yaml: key \"max_steps\": 010 is not a plain decimal integer"),
            std::string::npos);
  EXPECT_NE(message(std::string(kMinimal), {"seed=0x10"}).find("--set seed=0x10: key \"seed\": 0x10 is not a plain decimal"),
            std::string::npos);
  EXPECT_EQ(message(std::string(kMinimal) + "max_steps: 10\nseed: 0\nwarmup_steps: -0\n"), "no error");
  // A key with no value, or null, says so (`--set learning_rate=` reported the value "").
  for (const auto& [yaml, set] : std::vector<std::pair<std::string, std::string>>{
           {"learning_rate:\n", ""}, {"learning_rate: null\n", ""}, {"", "learning_rate="}, {"", "learning_rate=~"}}) {
    const std::string got = set.empty() ? message(std::string(kMinimal) + yaml) : message(kMinimal, {set});
    EXPECT_NE(got.find("key \"learning_rate\" must be a number, got no value (null)"), std::string::npos) << got;
  }
  // Keys of Hugging Face's TrainingArguments get Ingot's name for them, not a far-off suggestion.
  EXPECT_NE(message(std::string(kMinimal) + "num_train_epochs: 3\n").find("unknown key \"num_train_epochs\"; Ingot counts steps: set max_steps"),
            std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "per_device_train_batch_size: 8\n").find("Ingot's key is micro_batch_size"),
            std::string::npos);
  // Paths with a control character: a NUL, a newline kept by a block scalar.
  EXPECT_NE(message(std::string(kMinimal) + "output_dir: \"runs/a\\0junk\"\n")
                .find("bad.yaml: key \"output_dir\": the path holds a control character (byte 0) at offset 6"),
            std::string::npos);
  EXPECT_NE(message("train_data: [ok, \"d\\n\"]\n").find("key \"train_data\": the path holds a control character (byte 10)"),
            std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "model: |\n  models/base\n").find("key \"model\": the path holds a control"),
            std::string::npos);
  // Decoupled weight decay at lr x wd >= 1 zeroes or flips the weights each step.
  EXPECT_NE(message(std::string(kMinimal), {"learning_rate=1e-3", "weight_decay=1000"})
                .find("--set weight_decay=1000: learning_rate x weight_decay = 0.001 x 1000 is 1, at least 1"),
            std::string::npos)
      << message(std::string(kMinimal), {"learning_rate=1e-3", "weight_decay=1000"});
  EXPECT_EQ(message(std::string(kMinimal), {"learning_rate=1e-3", "weight_decay=999"}), "no error");
  // Explicit YAML tags: the key's own type, or refused (!foo was ignored, !!float 3 read as 3).
  EXPECT_NE(message(std::string(kMinimal) + "max_steps: !!float 3\n")
                .find("bad.yaml: key \"max_steps\" must be an integer, and its value carries the YAML tag !!float"),
            std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "seed: !foo 1\n").find("its value carries the YAML tag !foo"), std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "output_dir: !!int 3\n").find("key \"output_dir\" must be a string"),
            std::string::npos);
  const TrainConfig tagged = parse_train_config(std::string(kMinimal) + "learning_rate: !!float 1e-3\nmax_steps: !!int 7\n"
                                                "weight_decay: !!int 0\noutput_dir: !!str runs/x\ntrain_on_inputs: !!bool true\n",
                                                "x.yaml");
  EXPECT_EQ(tagged.learning_rate, 1e-3);
  EXPECT_EQ(tagged.max_steps, 7);
  EXPECT_EQ(tagged.output_dir.substr(tagged.output_dir.size() - 6), "runs/x");
  EXPECT_TRUE(tagged.train_on_inputs);
  // A value of two YAML documents is refused, as a file of two is (the second was dropped).
  EXPECT_NE(message(std::string(kMinimal), {"max_steps=2\n---\n5"})
                .find("--set max_steps: the value holds 2 YAML documents (separated by ---); give one value"),
            std::string::npos);
  EXPECT_NE(message(std::string(kMinimal), {"lr=1e-3"}).find("--set lr=1e-3: unknown key \"lr\"; Ingot's key is learning_rate"),
            std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "micro_batch_size: many\n").find("micro_batch_size"), std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "micro_batch_size: 0\n").find("between 1 and 1048576, got 0"), std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "lr_scheduler_type: exotic\n").find("exotic"), std::string::npos);
  EXPECT_NE(message("train_data: d\n").find("model_config"), std::string::npos);
  EXPECT_NE(message(kMinimal, {"seed"}).find("key=value"), std::string::npos);
  EXPECT_NE(message("a: [1,\n").find("bad.yaml"), std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "zzzzzzzzzz: 1\n").find("docs/config.md"), std::string::npos);
  // Silently ignored before (review, 2026-11-30): a key given twice, a second YAML document; and
  // a bad --set value was reported as the file's.
  EXPECT_NE(message(std::string(kMinimal) + "max_steps: 3\nmax_steps: 4\n").find("\"max_steps\" is given twice"),
            std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "---\nmax_steps: 4\n").find("2 YAML documents"), std::string::npos);
  const std::string from_set = message(kMinimal, {"max_steps=many"});
  EXPECT_NE(from_set.find("--set max_steps=many: key \"max_steps\" must be an integer"), std::string::npos) << from_set;
  // Checks across keys name the --set flag that gave the value too (they named the file: review of
  // 2026-12-01), and the file when the file gave it.
  for (const auto& [flag, text] :
       {std::pair{"val_fraction=1", "--set val_fraction=1: key \"val_fraction\" must be below 1"},
        std::pair{"adam_beta2=1", "--set adam_beta2=1: key \"adam_beta2\" must be below 1"},
        std::pair{"packing=tight", "--set packing=tight: key \"packing\" must be auto"},
        std::pair{"device=tpu", "--set device=tpu: key \"device\" must be auto, cpu or cuda"},
        std::pair{"lr_scheduler_type=exotic", "--set lr_scheduler_type=exotic: unknown lr_scheduler_type \"exotic\""},
        std::pair{"grad_dtype=bf16", "--set grad_dtype=bf16: grad_dtype \"bf16\" needs precision bf16"},
        std::pair{"adam_epsilon=0", "--set adam_epsilon=0: key \"adam_epsilon\" must be at least"}}) {
    const std::string m = message(std::string(kMinimal) + "precision: fp32\n", {flag});
    EXPECT_NE(m.find(text), std::string::npos) << m;
  }
  // The key at fault decides: grad_dtype came from the file, so the file is named, not the
  // other recipe flag given with --set (review of 2026-12-01).
  const std::string grad_from_file =
      message(std::string(kMinimal) + "precision: fp32\ngrad_dtype: bf16\n", {"master_weights=true"});
  EXPECT_NE(grad_from_file.find("bad.yaml: grad_dtype \"bf16\" needs precision bf16"), std::string::npos) << grad_from_file;
  const std::string from_file = message(std::string(kMinimal) + "adam_epsilon: 1.0e-300\n", {"max_steps=3"});
  EXPECT_NE(from_file.find("bad.yaml: key \"adam_epsilon\" must be at least"), std::string::npos) << from_file;
}

// grad_dtype / optimizer_state_dtype: parsed, checked against the precision, and carried into
// the recipe; a bad value names the key, the file and the value.
// A typo in an inline model_config is an error with a suggestion (it used to be ignored, training
// the default instead: bad-input review of 2026-12-01). A config.json may hold any other key.
TEST(TrainConfig, InlineModelConfigRefusesUnknownKeys) {
  const std::string model = "model_config:\n  model_type: llama\n  vocab_size: 257\n  hidden_size: 32\n"
                            "  intermediate_size: 48\n  num_hidden_layers: 1\n  num_attention_heads: 4\n";
  const TrainConfig ok = parse_train_config(model + "  num_key_value_heads: 2\ntrain_data: d\n", "x.yaml");
  EXPECT_EQ(resolve_model_config(ok).num_key_value_heads, 2);
  // The bookkeeping keys of a real config.json (docs/formats.md lists them) paste in.
  const TrainConfig pasted = parse_train_config(
      model + "  pad_token_id: 0\n  transformers_version: 4.57.1\n  use_cache: true\n  architectures: [LlamaForCausalLM]\n"
              "train_data: d\n", "x.yaml");
  EXPECT_EQ(resolve_model_config(pasted).hidden_size, 32);
  // So does each fixture's whole config.json (JSON is YAML): Llama's carries pretraining_tp.
  for (const char* arch : {"llama", "qwen2", "qwen3"}) {
    const std::string json_text = test::read_file(test::source_dir() + "/tests/fixtures/" + arch + "/config.json");
    ASSERT_FALSE(json_text.empty()) << arch;
    const TrainConfig fixture = parse_train_config("model_config: " + json_text + "\ntrain_data: d\n", "x.yaml");
    EXPECT_EQ(resolve_model_config(fixture).vocab_size, 128) << arch;
  }
  const TrainConfig typo = parse_train_config(model + "  num_key_valu_heads: 2\ntrain_data: d\n", "x.yaml");
  const std::string message = error_message([&] { resolve_model_config(typo); });
  EXPECT_NE(message.find("x.yaml (model_config): unknown key \"num_key_valu_heads\"; did you mean \"num_key_value_heads\"?"),
            std::string::npos)
      << message;
  // A key given twice, an empty value (null: it read as the default), a non-decimal integer.
  const std::string twice = error_message([&] { parse_train_config(model + "  hidden_size: 64\ntrain_data: d\n", "x.yaml"); });
  EXPECT_NE(twice.find("x.yaml: model_config: key \"hidden_size\" is given twice"), std::string::npos) << twice;
  const std::string empty = error_message([&] { parse_train_config(model + "  rms_norm_eps:\ntrain_data: d\n", "x.yaml"); });
  EXPECT_NE(empty.find("x.yaml: model_config key \"rms_norm_eps\" has no value"), std::string::npos) << empty;
  const TrainConfig null_scaling = parse_train_config(model + "  rope_scaling: null\ntrain_data: d\n", "x.yaml");
  EXPECT_FALSE(resolve_model_config(null_scaling).rope_scaling.enabled);
  const std::string octal = error_message([&] { parse_train_config(model + "  num_key_value_heads: 02\ntrain_data: d\n", "x.yaml"); });
  EXPECT_NE(octal.find("model_config.num_key_value_heads: 02 is not a plain decimal integer"), std::string::npos) << octal;
  // Booleans read as at the top level (y/n, yes/no, on/off), and an explicit tag must fit the value,
  // as there: !!str true is the string "true", !foo was ignored, and !!int on a real read the real.
  const TrainConfig yes = parse_train_config(model + "  tie_word_embeddings: y\n  attention_bias: off\ntrain_data: d\n", "x.yaml");
  EXPECT_TRUE(resolve_model_config(yes).tie_word_embeddings);
  EXPECT_FALSE(resolve_model_config(yes).attention_bias);
  const TrainConfig tagged = parse_train_config(
      model + "  tie_word_embeddings: !!bool true\n  rope_theta: !!float 20000\n  num_key_value_heads: !!int 2\n"
              "  hidden_act: !!str silu\ntrain_data: d\n", "x.yaml");
  EXPECT_TRUE(resolve_model_config(tagged).tie_word_embeddings);
  EXPECT_EQ(resolve_model_config(tagged).rope_theta, 20000.0);
  EXPECT_EQ(resolve_model_config(tagged).num_key_value_heads, 2);
  const TrainConfig as_string = parse_train_config(model + "  tie_word_embeddings: !!str true\ntrain_data: d\n", "x.yaml");
  EXPECT_NE(error_message([&] { resolve_model_config(as_string); }).find("must be true or false, got string \"true\""),
            std::string::npos);
  const std::string map_tag = error_message([&] {
    parse_train_config(model + "  rope_scaling: !foo {rope_type: llama3}\ntrain_data: d\n", "x.yaml");
  });
  EXPECT_NE(map_tag.find("x.yaml: model_config.rope_scaling: the mapping carries the YAML tag !foo"), std::string::npos)
      << map_tag;
  const TrainConfig map_ok = parse_train_config(model + "  architectures: !!seq [LlamaForCausalLM]\ntrain_data: d\n", "x.yaml");
  EXPECT_EQ(resolve_model_config(map_ok).hidden_size, 32);
  for (const auto& [value, shown] : {std::pair{"!foo true", "the value true carries the YAML tag !foo"},
                                     std::pair{"!!int 2.5", "the value 2.5 carries the YAML tag !!int"},
                                     std::pair{"!!bool 1", "the value 1 carries the YAML tag !!bool"}}) {
    const std::string m = error_message([&] { parse_train_config(model + "  rope_theta: " + value + "\ntrain_data: d\n", "x.yaml"); });
    EXPECT_NE(m.find(std::string("x.yaml: model_config.rope_theta: ") + shown), std::string::npos) << m;
  }
  // Given by --set, the error names the flag, not the file.
  const std::string flag = "model_config={model_type: llama, vocab_size: 257, hidden_size: 32, intermediate_size: 48, "
                           "num_hidden_layers: 1, num_attention_heads: 4, num_key_valu_heads: 2}";
  const TrainConfig by_flag = parse_train_config(model + "train_data: d\n", "x.yaml", {flag});
  const std::string from_flag = error_message([&] { resolve_model_config(by_flag); });
  EXPECT_NE(from_flag.find("--set " + flag + " (model_config): unknown key \"num_key_valu_heads\""), std::string::npos) << from_flag;
}

TEST(TrainConfig, GradAndOptimizerStateDtypes) {
  const TrainConfig c = parse_train_config(std::string(kMinimal) + "precision: bf16\ngrad_dtype: bf16\n", "x.yaml",
                                           {"optimizer_state_dtype=bf16", "master_weights=false"});
  const Recipe r = make_recipe(c.precision, Device::cuda, c.recipe_options());
  EXPECT_EQ(r.grad, DType::bf16);
  EXPECT_EQ(r.optimizer_state, DType::bf16);
  EXPECT_FALSE(r.master_weights);
  const Recipe defaults = make_recipe("bf16", Device::cuda);
  EXPECT_EQ(defaults.grad, DType::f32);
  EXPECT_EQ(defaults.optimizer_state, DType::f32);
  EXPECT_TRUE(defaults.master_weights);
  const std::string bad_value = error_message([] { parse_train_config(std::string(kMinimal) + "grad_dtype: fp8\n", "bad.yaml"); });
  for (const char* needle : {"bad.yaml", "grad_dtype", "fp8"})
    EXPECT_NE(bad_value.find(needle), std::string::npos) << bad_value;
  const std::string on_fp32 = error_message([] {
    parse_train_config(std::string(kMinimal) + "precision: fp32\noptimizer_state_dtype: bf16\n", "bad.yaml");
  });
  for (const char* needle : {"bad.yaml", "optimizer_state_dtype", "fp32"})
    EXPECT_NE(on_fp32.find(needle), std::string::npos) << on_fp32;
  const std::string recipe_fp32 = error_message([] { make_recipe("fp32", Device::cpu, {true, "bf16", "f32"}); });
  EXPECT_NE(recipe_fp32.find("grad_dtype"), std::string::npos) << recipe_fp32;
  const std::string recipe_bad = error_message([] { make_recipe("bf16", Device::cuda, {true, "f32", "f16"}); });
  EXPECT_NE(recipe_bad.find("optimizer_state_dtype"), std::string::npos) << recipe_bad;
}

// stochastic_rounding: off by default, carried into the recipe (and its description in the log),
// refused with precision fp32, where nothing is stored in bf16; a bad value names the key.
TEST(TrainConfig, StochasticRounding) {
  EXPECT_FALSE(make_recipe("bf16", Device::cuda).stochastic_rounding);
  const TrainConfig c = parse_train_config(std::string(kMinimal) + "precision: bf16\nstochastic_rounding: true\n",
                                           "x.yaml", {"master_weights=false"});
  const Recipe r = make_recipe(c.precision, Device::cuda, c.recipe_options());
  EXPECT_TRUE(r.stochastic_rounding);
  EXPECT_NE(describe(r).find("stochastic rounding"), std::string::npos) << describe(r);
  // With master weights and f32 moments nothing is rounded stochastically, and the log does not say so.
  const Recipe nothing_to_round = make_recipe("bf16", Device::cuda, {true, "f32", "f32", true});
  EXPECT_FALSE(rounds_stochastically(nothing_to_round));
  EXPECT_EQ(describe(nothing_to_round).find("stochastic"), std::string::npos) << describe(nothing_to_round);
  const std::string on_fp32 = error_message([] {
    parse_train_config(std::string(kMinimal) + "precision: fp32\nstochastic_rounding: true\n", "bad.yaml");
  });
  for (const char* needle : {"bad.yaml", "stochastic_rounding", "fp32"})
    EXPECT_NE(on_fp32.find(needle), std::string::npos) << on_fp32;
  const std::string bad_value = error_message([] {
    parse_train_config(std::string(kMinimal) + "stochastic_rounding: sometimes\n", "bad.yaml");
  });
  for (const char* needle : {"bad.yaml", "stochastic_rounding", "sometimes"})
    EXPECT_NE(bad_value.find(needle), std::string::npos) << bad_value;
}

// The optimizer gets every AdamW key of the run's config, and draws its stochastic rounding from
// the run's seed (a bf16 recipe's draws; the runs that use them need CUDA).
TEST(TrainConfig, AdamWSettingsComeFromTheConfig) {
  const TrainConfig c = parse_train_config(std::string(kMinimal) +
                                               "adam_beta1: 0.8\nadam_beta2: 0.97\nadam_epsilon: 1.0e-6\n"
                                               "weight_decay: 0.05\nmax_grad_norm: 0.5\nseed: 1234\n"
                                               "weight_decay_norms: true\nweight_decay_biases: true\n"
                                               "weight_decay_embeddings: true\n",
                                           "adam.yaml");
  const AdamWConfig adam = adamw_config(c);
  EXPECT_EQ(adam.beta1, 0.8);
  EXPECT_EQ(adam.beta2, 0.97);
  EXPECT_EQ(adam.eps, 1.0e-6);
  EXPECT_EQ(adam.weight_decay, 0.05);
  EXPECT_EQ(adam.max_grad_norm, 0.5);
  EXPECT_EQ(adam.rounding_seed, 1234u);
  EXPECT_TRUE(adam.decay_norms);
  EXPECT_TRUE(adam.decay_biases);
  EXPECT_TRUE(adam.decay_embeddings);
  const AdamWConfig defaults = adamw_config(parse_train_config(kMinimal, "defaults.yaml"));
  EXPECT_EQ(defaults.rounding_seed, 42u);  // the default seed
  EXPECT_FALSE(defaults.decay_norms);
}

// The memory plan follows the recipe: bf16 gradients and AdamW moments take half the bytes of
// f32 ones, and no master weights take none; parameters and activations do not change. Llama-3-8B
// at 4096 x 1, the shape that needs them.
TEST(MemoryPlan, Bf16GradsAndStateHalveTheirBytes) {
  const ModelConfig config = bench_preset("llama-3-8b");
  const TrainingMemory f32 = estimate_training_memory(config, make_recipe("bf16", Device::cuda), Device::cuda, 1, 4096);
  const TrainingMemory bf16 = estimate_training_memory(
      config, make_recipe("bf16", Device::cuda, {false, "bf16", "bf16"}), Device::cuda, 1, 4096);
  EXPECT_GT(f32.grads, int64_t{8} << 30);
  EXPECT_EQ(bf16.grads * 2, f32.grads);
  EXPECT_EQ(bf16.optimizer * 2, f32.optimizer);
  EXPECT_EQ(f32.master, f32.grads);  // f32 master: 4 bytes a parameter, as f32 gradients
  EXPECT_EQ(bf16.master, 0);
  EXPECT_EQ(bf16.params, f32.params);
  EXPECT_EQ(bf16.activations, f32.activations);
}

// A plan past 2^63 bytes is named, not wrapped: sizes within every config.json limit at once with a
// large batch gave a negative total, and the check against free memory passed it.
TEST(MemoryPlan, SizesPastTwoToTheSixtyThreeBytesAreNamed) {
  ModelConfig config = bench_preset("llama-3.2-1b");
  config.hidden_size = 262144;
  config.intermediate_size = 1048576;
  config.num_attention_heads = config.num_key_value_heads = 4096;
  config.head_dim = 4096;
  config.num_hidden_layers = 4096;
  const std::string msg = test::error_of(
      [&] { estimate_training_memory(config, make_recipe("fp32", Device::cpu), Device::cpu, 4096, 2048); });
  EXPECT_NE(msg.find("arena activations: the plan needs more than 2^63 bytes (at a f32 tensor of shape ("),
            std::string::npos) << msg;
  const TrainingMemory fits = estimate_training_memory(bench_preset("llama-3.2-1b"), make_recipe("fp32", Device::cpu),
                                                       Device::cpu, 4, 4096);
  EXPECT_GT(fits.total(), int64_t{10} << 30);
}

// The workspace the memory plan charges a cuDNN deterministic backward call: every figure that
// cuDNN 9.14 reported on an H200 (2026-12-02, docs/cuda.md; tools/cudnn_workspace_probe.sh prints
// tenths of a MiB, CudaMemoryPlan.CudnnBackwardWorkspaceIsWhatThePlanCharges thousandths), as
// printed. Lengths that are not a multiple of 128 pad the T x T matrix (T = 777: 832 x 896); the
// plan charged 13 MiB short there before it knew. The CUDA test holds the formula to the cuDNN
// installed.
TEST(MemoryPlan, CudnnBackwardPlanBytesAreWhatCudnnReported) {
  struct Reported {
    int64_t B, T, Hq, D;
    double mib, last_digit;  // as printed, and the place of its last digit
  };
  for (const Reported& r : {Reported{4, 4096, 32, 64, 4226.0, 0.1}, Reported{1, 4096, 32, 64, 1056.5, 0.1},
                            Reported{1, 4096, 8, 64, 264.1, 0.1}, Reported{1, 32768, 16, 64, 32898.0, 0.1},
                            Reported{1, 32768, 4, 64, 8224.5, 0.1}, Reported{4, 4096, 16, 128, 2177.0, 0.1},
                            Reported{1, 4096, 8, 128, 272.1, 0.1}, Reported{1, 4096, 2, 128, 68.031, 0.001},
                            Reported{4, 4096, 14, 64, 1848.875, 0.001}, Reported{2, 1000, 14, 64, 62.943, 0.001},
                            Reported{3, 777, 16, 128, 86.604, 0.001}}) {
    const double mib = double(cuda::cudnn_backward_plan_bytes(r.B, r.T, r.Hq, r.D)) / (1 << 20);
    // Half the last digit, and a kilobyte for what cuDNN aligns.
    EXPECT_NEAR(mib, r.mib, r.last_digit / 2 + 0.001) << r.B << " x " << r.T << " x " << r.Hq << " heads of " << r.D;
  }
  EXPECT_EQ(cuda::cudnn_backward_plan_bytes(1, int64_t{1} << 40, 32, 64), std::numeric_limits<int64_t>::max());
  // The margin on top saturates too (it wrapped to a negative charge, which the plan then dropped).
  EXPECT_EQ(cuda::cudnn_backward_charge_bytes(1, int64_t{1} << 40, 32, 64), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(cuda::cudnn_backward_charge_bytes(4, 4096, 32, 64),
            cuda::cudnn_backward_plan_bytes(4, 4096, 32, 64) + cuda::kCudnnWorkspaceMarginBytes);
}

// How cuDNN's deterministic attention backward is split to fit a workspace limit (the arithmetic
// of attention_cudnn.h; the CUDA test BackwardSplitsToFitTheWorkspaceLimit runs it): whole calls
// while they fit, then fewer rows (divisors of B), then one row and fewer kv heads (divisors of Hkv),
// then nothing.
TEST(MemoryPlan, CudnnBackwardSplitTakesTheLargestSliceThatFits) {
  constexpr int64_t GiB = int64_t{1} << 30;
  using cuda::cudnn_backward_split;
  EXPECT_EQ(cuda::cudnn_backward_workspace_bytes(4, 4096, 32), 4 * GiB);  // Llama-3.2-1B at 4 x 4096
  struct Want {
    int64_t B, T, Hq, Hkv, limit, rows, kv_heads, calls;
  };
  for (const Want& w : {Want{4, 4096, 32, 8, 4 * GiB, 4, 8, 1},
                        Want{4, 4096, 32, 8, 4 * GiB - 1, 2, 8, 2},
                        Want{4, 4096, 32, 8, 3 * GiB, 2, 8, 2},  // 3 rows do not divide 4
                        Want{4, 4096, 32, 8, GiB, 1, 8, 4},
                        Want{4, 4096, 32, 8, GiB - 1, 1, 4, 8},
                        Want{3, 4096, 32, 8, 2 * GiB, 1, 8, 3},
                        Want{1, 32768, 32, 8, 64 * GiB, 1, 8, 1},  // 2 GiB a head at 32768
                        Want{1, 32768, 32, 8, 40 * GiB, 1, 4, 2},
                        Want{1, 32768, 32, 8, 20 * GiB, 1, 2, 4},  // 3 kv heads do not divide 8
                        Want{1, 32768, 32, 8, 8 * GiB, 1, 1, 8},   // one kv head, its 4 query heads
                        Want{1, 32768, 32, 8, 8 * GiB - 1, 0, 0, 0},
                        Want{2, 1024, 8, 8, 0, 0, 0, 0}}) {
    const cuda::CudnnBackwardSplit split = cudnn_backward_split(w.B, w.T, w.Hq, w.Hkv, w.limit);
    const std::string what = std::to_string(w.B) + " x " + std::to_string(w.T) + ", limit " + std::to_string(w.limit);
    EXPECT_EQ(split.rows, w.rows) << what;
    EXPECT_EQ(split.kv_heads, w.kv_heads) << what;
    EXPECT_EQ(split.fits(), w.rows > 0) << what;
    if (!split.fits()) continue;
    EXPECT_EQ(split.calls(w.B, w.Hkv), w.calls) << what;
    EXPECT_LE(split.workspace_bytes(w.T, w.Hq, w.Hkv), w.limit) << what;
    EXPECT_EQ(split.workspace_bytes(w.T, w.Hq, w.Hkv) * split.calls(w.B, w.Hkv),
              cuda::cudnn_backward_workspace_bytes(w.B, w.T, w.Hq))
        << what << ": the slices cover the whole";
  }
  // Slices start their lse (b * Hq + q_head) * T floats in, which cuDNN wants 16-byte aligned: at
  // Qwen2.5-0.5B's 14 / 2 heads and T = 4095, one row (14 * 4095 floats) is no multiple of 4, two
  // are. The split used to offer the unaligned slicing, which the backward then declined, running on
  // the tensor-core kernels while the memory plan's note said cuDNN.
  const int64_t odd_row = cuda::cudnn_backward_workspace_bytes(1, 4095, 14);
  for (const Want& w : {Want{4, 4095, 14, 2, 2 * odd_row, 2, 2, 2},
                        Want{4, 4095, 14, 2, 2 * odd_row - 1, 0, 0, 0},  // one row a call is unaligned
                        Want{1, 4095, 14, 2, odd_row - 1, 0, 0, 0},      // so is one kv head (7 * 4095)
                        Want{4, 4096, 14, 2, cuda::cudnn_backward_workspace_bytes(1, 4096, 14), 1, 2, 4},
                        Want{1, 4096, 14, 2, cuda::cudnn_backward_workspace_bytes(1, 4096, 7), 1, 1, 2}}) {
    const cuda::CudnnBackwardSplit split = cudnn_backward_split(w.B, w.T, w.Hq, w.Hkv, w.limit);
    const std::string what = std::to_string(w.B) + " x " + std::to_string(w.T) + ", limit " + std::to_string(w.limit);
    EXPECT_EQ(split.rows, w.rows) << what;
    EXPECT_EQ(split.kv_heads, w.kv_heads) << what;
    if (split.fits()) EXPECT_EQ(split.calls(w.B, w.Hkv), w.calls) << what;
  }
  // Every slicing a memory plan may choose is aligned.
  for (const cuda::CudnnBackwardSplit& split : cuda::cudnn_backward_splits(6, 4095, 14, 2)) {
    if (split.rows < 6) EXPECT_EQ(split.rows * 14 * 4095 % 4, 0) << split.rows << " rows";
    if (split.kv_heads < 2) EXPECT_EQ(split.kv_heads * 7 * 4095 % 4, 0) << split.kv_heads << " kv heads";
  }
  // Six rows: one call, then two rows a call; one or three rows a call would start unaligned.
  EXPECT_EQ(cuda::cudnn_backward_splits(6, 4095, 14, 2).size(), 2u);
  // Absurd shapes still get the right slices (the search walks divisors up to sqrt(B)), and the
  // workspace saturates rather than wraps around into one that fits.
  const cuda::CudnnBackwardSplit huge = cudnn_backward_split(4000000000, 4096, 32, 8, 4 * GiB);
  EXPECT_EQ(huge.rows, 4);  // 1 GiB a row; 4 divides 4e9
  EXPECT_EQ(huge.kv_heads, 8);
  EXPECT_EQ(cudnn_backward_split(999999937, 4096, 32, 8, 4 * GiB).rows, 1);  // a prime number of rows
  EXPECT_EQ(cuda::cudnn_backward_workspace_bytes(1, int64_t{1} << 40, 32), std::numeric_limits<int64_t>::max());
  EXPECT_FALSE(cudnn_backward_split(1, int64_t{1} << 40, 32, 8, int64_t{1} << 62).fits());
#ifdef INGOT_HAVE_CUDA
  // The CUDA memory plan records the attention it will fit the workspace to (fit_attention_workspace).
  const TrainingMemory m = estimate_training_memory(bench_preset("llama-3-8b"), make_recipe("bf16", Device::cuda),
                                                    Device::cuda, 1, 32768);
  EXPECT_EQ(m.attention.B, 1);
  EXPECT_EQ(m.attention.T, 32768);
  EXPECT_EQ(m.attention.Hq, 32);
  EXPECT_EQ(m.attention.Hkv, 8);
  EXPECT_EQ(m.attention.D, 128);
  EXPECT_FALSE(m.attention.packed_rows);
  const AttentionWorkspaceRange range = attention_workspace_range(m);
  if (cuda::attention_cudnn_compiled()) {
    EXPECT_GE(m.attention_workspace, 64 * GiB);
    EXPECT_EQ(range.one_call, m.attention_workspace);
    // One row's one kv head (4 query heads) at 32768: 8 GiB of T x T matrices, plus the rest.
    EXPECT_GE(range.smallest_slice, 8 * GiB);
    EXPECT_LT(range.smallest_slice, 9 * GiB);
    // At the longest row a step takes, cuDNN's workspace saturates int64: the plan's sums wrapped to
    // a negative total (`info --seq 268435456` printed one). Capped, they stay positive and ordered.
    ModelConfig wide = bench_preset("llama-3-8b");
    wide.num_attention_heads = wide.num_key_value_heads = 128;
    const TrainingMemory longest = estimate_training_memory(wide, make_recipe("bf16", Device::cuda), Device::cuda, 1,
                                                            kMaxTokensPerStep);
    const AttentionWorkspaceRange longest_range = attention_workspace_range(longest);
    EXPECT_GT(longest.scratch, longest.attention_workspace);
    EXPECT_GT(longest.total(), longest.scratch);
    EXPECT_GT(longest_range.smallest_slice, 0);
    EXPECT_LE(longest_range.smallest_slice, longest_range.one_call);
    EXPECT_GT(longest.total() - longest_range.one_call + longest_range.smallest_slice, longest.activations);
  }
#endif
  // No workspace on the CPU.
  const TrainingMemory cpu = estimate_training_memory(bench_preset("llama-3-8b"), make_recipe("fp32", Device::cpu),
                                                      Device::cpu, 1, 32768);
  EXPECT_EQ(attention_workspace_range(cpu).one_call, 0);
  EXPECT_EQ(attention_workspace_range(cpu).smallest_slice, 0);
}

// The trainer's warnings about rounding to nearest: for bf16 moments whose 1 - beta is below half
// a bf16 step (2^-8), one per key concerned, naming it, none with f32 moments or betas up to 0.996;
// for bf16 weights without master, one naming the magnitude above which no weight moves at that
// learning rate; none of either with stochastic rounding.
TEST(TrainConfig, Bf16RoundingWarnings) {
  const Recipe bf16_state = make_recipe("bf16", Device::cuda, {true, "f32", "bf16"});
  const double lr = 1e-4;
  EXPECT_TRUE(AdamW::bf16_rounding_warnings(make_recipe("bf16", Device::cuda), 0.9, 0.999, lr).empty());
  EXPECT_TRUE(AdamW::bf16_rounding_warnings(make_recipe("fp32", Device::cpu), 0.9, 0.999, lr).empty());
  EXPECT_TRUE(AdamW::bf16_rounding_warnings(bf16_state, 0.9, 0.95, lr).empty());
  EXPECT_TRUE(AdamW::bf16_rounding_warnings(bf16_state, 0.9, 0.996, lr).empty());
  const std::vector<std::string> w = AdamW::bf16_rounding_warnings(bf16_state, 0.9, 0.999, lr);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("adam_beta2 0.999"), std::string::npos) << w[0];
  const std::vector<std::string> both = AdamW::bf16_rounding_warnings(bf16_state, 0.998, 0.999, lr);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_NE(both[0].find("adam_beta1"), std::string::npos) << both[0];
  const Recipe no_master = make_recipe("bf16", Device::cuda, {false, "f32", "f32"});
  const std::vector<std::string> weights = AdamW::bf16_rounding_warnings(no_master, 0.9, 0.999, lr);
  ASSERT_EQ(weights.size(), 1u);
  for (const char* needle : {"master_weights: false", "above 0.03125 ", "stochastic_rounding: true"})
    EXPECT_NE(weights[0].find(needle), std::string::npos) << weights[0];
  EXPECT_EQ(AdamW::bf16_rounding_warnings(make_recipe("bf16", Device::cuda, {false, "bf16", "bf16"}), 0.9, 0.999, lr).size(),
            2u);
  EXPECT_TRUE(
      AdamW::bf16_rounding_warnings(make_recipe("bf16", Device::cuda, {false, "bf16", "bf16", true}), 0.9, 0.999, lr)
          .empty());
  // 2^(floor(log2 lr) + 9): at 1e-5, 2^-8.
  const std::vector<std::string> low = AdamW::bf16_rounding_warnings(no_master, 0.9, 0.95, 1e-5);
  ASSERT_EQ(low.size(), 1u);
  EXPECT_NE(low[0].find("above 0.00390625 "), std::string::npos) << low[0];
  // Stochastic rounding with nothing to round says so.
  const std::vector<std::string> no_op =
      AdamW::bf16_rounding_warnings(make_recipe("bf16", Device::cuda, {true, "f32", "f32", true}), 0.9, 0.999, lr);
  ASSERT_EQ(no_op.size(), 1u);
  EXPECT_NE(no_op[0].find("has no effect"), std::string::npos) << no_op[0];
}

TEST(TrainConfig, EveryKeyIsDocumented) {
  const std::string doc = test::read_file(test::source_dir() + "/docs/config.md");
  for (const ConfigKeyInfo& k : train_config_keys())
    EXPECT_NE(doc.find("| `" + std::string(k.name) + "` | `" + k.default_value + "` | " + k.help + " |\n"), std::string::npos)
        << k.name << " is missing from docs/config.md, or its default or its text differs from --list-keys'";
}

// The engine switches of the environment: a listed value, or unset/empty; anything else is an error
// that names the variable, the value and the choices (a typo must not quietly run the default).
TEST(EngineSwitches, AcceptListedValuesAndNameAnyOther) {
  const char* name = "INGOT_TEST_SWITCH";
  struct Unset {
    const char* name;
    ~Unset() { unsetenv(name); }
  } unset{name};
  unsetenv(name);
  EXPECT_EQ(env_choice(name, {"mma", "kernels"}), "");
  EXPECT_FALSE(env_flag(name));
  setenv(name, "", 1);
  EXPECT_EQ(env_choice(name, {"mma", "kernels"}), "");
  setenv(name, "kernels", 1);
  EXPECT_EQ(env_choice(name, {"mma", "kernels"}), "kernels");
  setenv(name, "1", 1);
  EXPECT_TRUE(env_flag(name));
  setenv(name, "0", 1);
  EXPECT_FALSE(env_flag(name));
  for (const char* bad : {"Kernels", "kernels ", "mm"}) {
    setenv(name, bad, 1);
    const std::string message = error_message([&] { env_choice(name, {"mma", "kernels"}); });
    EXPECT_NE(message.find(std::string("INGOT_TEST_SWITCH must be one of mma, kernels (or unset), got \"") + bad + "\""),
              std::string::npos)
        << message;
  }
  setenv(name, "yes", 1);
  EXPECT_NE(error_message([&] { env_flag(name); }).find("must be one of 0, 1"), std::string::npos);
}

TEST(LrSchedule, MatchesHuggingFaceShapes) {
  LrSchedule s;
  s.peak = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.type = "cosine";
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(5), 0.5);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.5, 1e-12);
  EXPECT_NEAR(s.at(110), 0.0, 1e-12);
  // A quarter of the way: the cosine's value, not the midpoint where it meets the linear ramp.
  EXPECT_NEAR(s.at(35), 0.5 * (1 + std::cos(M_PI / 4)), 1e-12);  // 0.8536 (linear: 0.75)
  EXPECT_NEAR(s.at(85), 0.5 * (1 + std::cos(3 * M_PI / 4)), 1e-12);
  s.type = "linear";
  EXPECT_NEAR(s.at(60), 0.5, 1e-12);
  EXPECT_NEAR(s.at(35), 0.75, 1e-12);
  s.type = "constant";
  EXPECT_DOUBLE_EQ(s.at(100), 1.0);
  s.type = "wsd";
  s.decay_ratio = 0.2;  // decays over the last 22 steps
  EXPECT_DOUBLE_EQ(s.at(80), 1.0);
  EXPECT_NEAR(s.at(99), 0.5, 1e-12);
  EXPECT_NEAR(s.at(93), 17.0 / 22.0, 1e-12);
  s.min_lr_ratio = 0.1;
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  s.type = "cosine";  // cosine with a floor: HF's cosine_with_min_lr
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-12);
}
