// TrainConfig parsing: defaults, types, overrides, suggestions, and docs/config.md completeness.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "ingot/core/error.h"
#include "ingot/optim/lr_schedule.h"
#include "ingot/train/train_config.h"
#include "test_util.h"

using namespace ingot;

static const char* kMinimal = "model_config: cfg.json\ntrain_data: data\n";

TEST(TrainConfig, DefaultsAndOverrides) {
  const TrainConfig c = parse_train_config(kMinimal, "x.yaml", {"learning_rate=1e-3", "train_data=[a, b]"});
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-3);
  EXPECT_EQ(c.train_data, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.micro_batch_size, 8);
  EXPECT_EQ(c.lr_scheduler_type, "cosine");
}

TEST(TrainConfig, InlineModelConfig) {
  const TrainConfig c = parse_train_config(
      "model_config:\n  model_type: qwen3\n  vocab_size: 64\n  hidden_size: 32\n  intermediate_size: 40\n"
      "  num_hidden_layers: 1\n  num_attention_heads: 4\n  head_dim: 16\ntrain_data: d\n", "x.yaml");
  const ModelConfig m = resolve_model_config(c);
  EXPECT_EQ(m.architecture, Architecture::qwen3);
  EXPECT_EQ(m.head_dim, 16);
  EXPECT_TRUE(m.qk_norm);
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
  EXPECT_NE(message(std::string(kMinimal) + "micro_batch_size: many\n").find("micro_batch_size"), std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "micro_batch_size: 0\n").find(">= 1"), std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "lr_scheduler_type: exotic\n").find("exotic"), std::string::npos);
  EXPECT_NE(message("train_data: d\n").find("model_config"), std::string::npos);
  EXPECT_NE(message(kMinimal, {"seed"}).find("key=value"), std::string::npos);
  EXPECT_NE(message("a: [1,\n").find("bad.yaml"), std::string::npos);
  EXPECT_NE(message(std::string(kMinimal) + "zzzzzzzzzz: 1\n").find("docs/config.md"), std::string::npos);
}

TEST(TrainConfig, EveryKeyIsDocumented) {
  const std::string doc = test::read_file(test::source_dir() + "/docs/config.md");
  for (const ConfigKeyInfo& k : train_config_keys())
    EXPECT_NE(doc.find("| `" + std::string(k.name) + "` | `" + k.default_value + "` |"), std::string::npos)
        << k.name << " is missing from docs/config.md or its default differs";
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
  s.type = "linear";
  EXPECT_NEAR(s.at(60), 0.5, 1e-12);
  s.type = "constant";
  EXPECT_DOUBLE_EQ(s.at(100), 1.0);
  s.type = "wsd";
  s.decay_ratio = 0.2;  // decays over the last 22 steps
  EXPECT_DOUBLE_EQ(s.at(80), 1.0);
  EXPECT_NEAR(s.at(99), 0.5, 1e-12);
  s.min_lr_ratio = 0.1;
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
}
