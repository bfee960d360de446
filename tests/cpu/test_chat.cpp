// Chat formats against transformers' apply_chat_template (tests/fixtures/chat, made by
// tools/make_chat_fixtures.py): ids token for token, and the loss mask against the assistant spans
// cut out of the rendered text by their markers. The Llama 3 fixtures carry their own tokenizer
// and always run; the Qwen3 / ChatML ones need ../shared/data/tokenizers/qwen3 and skip without it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ingot/core/error.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/data/chat_format.h"
#include "ingot/data/unicode_nfc.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ingot;
using namespace ingot::data;

namespace {

std::string fixtures() { return test::source_dir() + "/tests/fixtures/chat"; }
std::string qwen3_dir() { return test::source_dir() + "/../shared/data/tokenizers/qwen3"; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return nlohmann::json::parse(in);
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an ingot::Error";
  return "";
}

std::vector<ChatMessage> case_messages(const nlohmann::json& c) {
  return c.contains("alpaca") ? alpaca_messages_from_json(c["alpaca"])
                              : chat_messages_from_json(c["messages"]);
}

// Every case: same ids as transformers; masked runs spell the assistant spans (a run may start
// with extra whitespace where one token straddles the header's newline and the content).
// nfc: the tokenizer normalizes to NFC, so the tokens spell the NFC form of the rendered text.
void check_fixture(const std::string& fixture, const BpeTokenizer& tok, const ChatFormat& format,
                   bool nfc) {
  const nlohmann::json data = read_json(fixtures() + "/" + fixture);
  int checked = 0;
  for (const auto& c : data["cases"]) {
    const std::string name = c["name"];
    const TokenizedChat out = tokenize_chat(format, tok, case_messages(c), false);
    EXPECT_EQ(out.tokens, c["ids"].get<std::vector<int32_t>>()) << fixture << " " << name;
    ASSERT_EQ(out.loss_mask.size(), out.tokens.size());
    std::vector<std::string> runs;
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      if (!out.loss_mask[i]) continue;
      if (i == 0 || !out.loss_mask[i - 1]) runs.emplace_back();
      runs.back() += token_bytes(tok, out.tokens[i]);
    }
    auto expected = c["trained_texts"].get<std::vector<std::string>>();
    if (nfc)
      for (std::string& e : expected) e = nfc_normalize(e);
    ASSERT_EQ(runs.size(), expected.size()) << fixture << " " << name;
    for (size_t r = 0; r < runs.size(); ++r) {
      ASSERT_GE(runs[r].size(), expected[r].size()) << name << " run " << r;
      const std::string extra = runs[r].substr(0, runs[r].size() - expected[r].size());
      EXPECT_EQ(runs[r].substr(extra.size()), expected[r]) << fixture << " " << name << " run " << r;
      EXPECT_EQ(extra.find_first_not_of(" \n"), std::string::npos) << name << " run " << r;
    }
    const TokenizedChat all = tokenize_chat(format, tok, case_messages(c), true);
    EXPECT_EQ(all.tokens, out.tokens);
    EXPECT_EQ(std::count(all.loss_mask.begin(), all.loss_mask.end(), 1),
              static_cast<std::ptrdiff_t>(all.tokens.size()));
    ++checked;
  }
  EXPECT_GE(checked, 10) << fixture;
}

}  // namespace

TEST(Chat, Llama3MatchesTransformers) {
  const std::string dir = fixtures() + "/llama3_tokenizer";
  const BpeTokenizer tok = BpeTokenizer::from_file(dir);
  const ChatFormat format = load_chat_format(dir);
  EXPECT_EQ(format.name(), "llama3");
  EXPECT_EQ(format.bos_token, "<|begin_of_text|>");
  check_fixture("llama3.json", tok, format, false);
}

TEST(Chat, Qwen3MatchesTransformers) {
  if (!fs::exists(qwen3_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "no Qwen3 tokenizer at " << qwen3_dir() << " (../shared is absent)";
  const BpeTokenizer tok = BpeTokenizer::from_file(qwen3_dir());
  const ChatFormat format = load_chat_format(qwen3_dir());
  EXPECT_EQ(format.name(), "chatml-qwen3");
  EXPECT_TRUE(format.default_system.empty());
  check_fixture("qwen3.json", tok, format, true);
}

TEST(Chat, ChatmlDefaultSystemMatchesTransformers) {
  if (!fs::exists(qwen3_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "no Qwen3 tokenizer at " << qwen3_dir() << " (../shared is absent)";
  const BpeTokenizer tok = BpeTokenizer::from_file(qwen3_dir());
  const ChatFormat format = load_chat_format(fixtures() + "/chatml_default");
  EXPECT_EQ(format.name(), "chatml");
  EXPECT_EQ(format.default_system, "You are a careful assistant. Answer briefly.");
  check_fixture("chatml_default.json", tok, format, true);
}

TEST(Chat, UnknownTemplateNamesSupportedFormats) {
  std::string msg = error_of([] {
    chat_format_from_template("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}",
                              "<s>", "mistral/tokenizer_config.json");
  });
  EXPECT_NE(msg.find("mistral/tokenizer_config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("chatml"), std::string::npos) << msg;
  msg = error_of([] {
    chat_format_from_template("<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date", "",
                              "x");
  });
  EXPECT_NE(msg.find("3.1"), std::string::npos) << msg;
  const std::string dir = test::temp_dir("chat_no_template");
  std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token": null})";
  msg = error_of([&] { load_chat_format(dir); });
  EXPECT_NE(msg.find("no chat_template"), std::string::npos) << msg;
}

TEST(Chat, BadMessagesNameTheProblem) {
  using nlohmann::json;
  std::string msg = error_of([] {
    chat_messages_from_json(json::parse(R"([{"role":"user","content":"a"},{"role":"tool","content":"b"}])"));
  });
  EXPECT_NE(msg.find("unknown role \"tool\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("message 1"), std::string::npos) << msg;
  msg = error_of([] { chat_messages_from_json(json::parse(R"([{"role":"user"}])")); });
  EXPECT_NE(msg.find("no \"content\""), std::string::npos) << msg;
  msg = error_of([] { chat_messages_from_json(json::parse(R"([{"content":"x"}])")); });
  EXPECT_NE(msg.find("no \"role\""), std::string::npos) << msg;
  msg = error_of([] { chat_messages_from_json(json::parse(R"({"role":"user"})")); });
  EXPECT_NE(msg.find("not an array"), std::string::npos) << msg;
  msg = error_of([] { chat_messages_from_json(json::parse("[]")); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  msg = error_of([] {
    chat_messages_from_json(json::parse(R"([{"role":"user","content":[{"type":"text"}]}])"));
  });
  EXPECT_NE(msg.find("not a string"), std::string::npos) << msg;
  msg = error_of([] { alpaca_messages_from_json(json::parse(R"({"instruction":"x"})")); });
  EXPECT_NE(msg.find("\"output\""), std::string::npos) << msg;
  const auto alpaca =
      alpaca_messages_from_json(json::parse(R"({"instruction":"Do","input":"this","output":"ok"})"));
  ASSERT_EQ(alpaca.size(), 2u);
  EXPECT_EQ(alpaca[0].content, "Do\n\nthis");
  EXPECT_EQ(alpaca[1].role, "assistant");
}

TEST(Chat, RenderedSpansCoverAssistantBodyAndEndOfTurn) {
  ChatFormat llama;
  llama.kind = ChatFormatKind::llama3;
  llama.bos_token = "<B>";
  const std::vector<ChatMessage> msgs = {{"user", " hi ", {}}, {"assistant", "\n yo \n", {}}};
  const RenderedChat r = render_chat(llama, msgs);
  EXPECT_EQ(r.text,
            "<B><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>"
            "assistant<|end_header_id|>\n\nyo<|eot_id|>");
  ASSERT_EQ(r.trained.size(), 1u);
  EXPECT_EQ(r.text.substr(r.trained[0].first, r.trained[0].second - r.trained[0].first),
            "yo<|eot_id|>");
}
