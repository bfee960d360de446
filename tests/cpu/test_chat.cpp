// Chat formats against transformers' apply_chat_template (tests/fixtures/chat, made by
// tools/make_chat_fixtures.py): ids token for token, and the loss mask against the assistant spans
// cut out of the rendered text by their markers. The Llama 3 fixtures carry their own tokenizer
// and always run; the Qwen3 / ChatML ones need ../shared/data/tokenizers/qwen3 and skip without it.
#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ingot/core/error.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/data/byte_tokenizer.h"
#include "ingot/data/prepare.h"
#include "ingot/data/shard.h"
#include "ingot/data/chat_format.h"
#include "ingot/data/unicode_nfc.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ingot;
using namespace ingot::data;
using test::error_of;

namespace {

std::string fixtures() { return test::source_dir() + "/tests/fixtures/chat"; }
std::string qwen3_dir() { return test::shared_dir() + "/data/tokenizers/qwen3"; }

// Today's local date in strftime's `pattern`, as Python's datetime.now().strftime gives it.
std::string today_as(const char* pattern) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[64];
  return std::string(text, std::strftime(text, sizeof text, pattern, &local));
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return nlohmann::json::parse(in);
}

std::vector<ChatMessage> case_messages(const nlohmann::json& c) {
  return c.contains("alpaca") ? alpaca_messages_from_json(c["alpaca"])
                              : chat_messages_from_json(c["messages"]);
}

// Every case: same ids as transformers; masked runs spell the assistant spans (a run may start
// with extra whitespace where one token straddles the header's newline and the content: only
// inside its first token, so a whole header token trained passes nowhere).
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
    std::vector<size_t> first_token_bytes;  // of each run
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      if (!out.loss_mask[i]) continue;
      if (i == 0 || !out.loss_mask[i - 1]) {
        runs.emplace_back();
        first_token_bytes.push_back(token_bytes(tok, out.tokens[i]).size());
      }
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
      EXPECT_LT(extra.size(), first_token_bytes[r]) << fixture << " " << name << " run " << r << ": a whole token before the span is trained";
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

// Llama 3.1's dated system turn, under a template written for the fixtures: today's date where the
// template calls strftime_now, as transformers renders it; the fixtures were rendered with
// date_string "26 Jul 2024", as --chat-date-string gives.
TEST(Chat, Llama31MatchesTransformers) {
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  const std::string before = today_as("%d %b %Y");
  ChatFormat format = load_chat_format(fixtures() + "/llama31");
  if (format.date_string == before) format.date_string = today_as("%d %b %Y");  // loaded as midnight passed
  EXPECT_EQ(format.name(), "llama3.1");
  EXPECT_EQ(format.bos_token, "<|begin_of_text|>");
  EXPECT_EQ(format.knowledge_date, "March 2025");
  EXPECT_EQ(format.date_string, today_as("%d %b %Y"));
  const nlohmann::json fixture = read_json(fixtures() + "/llama31.json");
  format.date_string = fixture.at("date_string").get<std::string>();
  check_fixture("llama31.json", tok, format, false);
}

// Where a Llama 3.1-style template has no strftime_now (Llama 3.1 and 3.3), its literal date_string
// is the date; one whose date or knowledge date is not a literal is refused, not guessed.
TEST(Chat, Llama31DateFromTemplate) {
  const std::string turns = "{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
                            "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}";
  const std::string header = "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n' }}"
                             "{{- 'Today Date: ' + date_string + '\\n\\n' + system_message + '<|eot_id|>' }}";
  const ChatFormat fixed = chat_format_from_template(
      "{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}" + header + turns, "", "t");
  EXPECT_EQ(fixed.name(), "llama3.1");
  EXPECT_EQ(fixed.knowledge_date, "December 2023");
  EXPECT_EQ(fixed.date_string, "26 Jul 2024");
  const std::vector<ChatMessage> chat = {{"system", "  Be brief.\n", std::nullopt}, {"user", "Hi", std::nullopt},
                                         {"assistant", " Hello ", std::nullopt}};
  const RenderedChat r = render_chat(fixed, chat);
  EXPECT_EQ(r.text, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: "
                    "26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>");
  ASSERT_EQ(r.trained.size(), 1u);
  EXPECT_EQ(r.text.substr(r.trained[0].first, r.trained[0].second - r.trained[0].first), "Hello<|eot_id|>");
  std::string msg = error_of([&] { chat_format_from_template("{%- set date_string = today() %}" + header + turns, "", "t"); });
  EXPECT_NE(msg.find("chat template of t: a Llama 3.1-style template whose \"Today Date: \" is neither"), std::string::npos) << msg;
  msg = error_of([&] { chat_format_from_template("{%- set date_string = strftime_now(fmt) %}" + header + turns, "", "t"); });
  EXPECT_NE(msg.find("strftime_now takes a literal date format"), std::string::npos) << msg;
  msg = error_of([&] { chat_format_from_template("{%- set date_string = strftime_now('%H:%M') %}" + header + turns, "", "t"); });
  EXPECT_NE(msg.find("got \"%H:%M\""), std::string::npos) << msg;
  msg = error_of([&] {
    chat_format_from_template("<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date", "", "x");
  });
  EXPECT_NE(msg.find("chat template of x: a Llama 3.1-style template that does not write"), std::string::npos) << msg;
  // Names are whole words, a call may have blanks before its parenthesis, and comments are not code
  // (a review, 2026-12-02).
  EXPECT_EQ(chat_format_from_template("{%- set date_string = strftime_now (\"%Y\") %}" + header + turns, "", "t").date_string,
            today_as("%Y"));
  EXPECT_EQ(chat_format_from_template("{# strftime_now('%Y') #}{%- set my_date_string = '1 Jan 2000' %}"
                                      "{%- set date_string = '26 Jul 2024' %}" + header + turns, "", "t").date_string,
            "26 Jul 2024");
  EXPECT_EQ(chat_format_from_template("{# Cutting Knowledge Date #}" + turns, "", "t").name(), "llama3");
  msg = error_of([&] {
    chat_format_from_template("{%- if x %}{%- set date_string = '1 Jan 2000' %}{%- else %}{%- set date_string = '2 Jan 2000' %}"
                              "{%- endif %}" + header + turns, "", "t");
  });
  EXPECT_NE(msg.find("the literals it sets date_string to differ (\"2 Jan 2000\" and \"1 Jan 2000\")"), std::string::npos)
      << msg;
}

// generate --chat's prompt: the conversation, then the assistant's header, as transformers renders
// apply_chat_template(..., add_generation_prompt=True) for conversations that end on a user turn.
TEST(Chat, GenerationPromptsMatchTransformers) {
  const nlohmann::json data = read_json(fixtures() + "/generation_prompts.json");
  int checked = 0;
  for (const auto& [folder, cases] : data.at("formats").items()) {
    const bool qwen3 = folder == "qwen3";
    if (qwen3 && !fs::exists(qwen3_dir() + "/tokenizer.json")) continue;  // ../shared is absent
    const std::string config_dir = qwen3 ? qwen3_dir() : fixtures() + "/" + folder;
    const BpeTokenizer tok = BpeTokenizer::from_file(folder == "llama31" ? fixtures() + "/llama3_tokenizer" : config_dir);
    ChatFormat format = load_chat_format(config_dir);
    if (format.name() == "llama3.1") format.date_string = data.at("date_string").get<std::string>();
    for (const auto& c : cases) {
      const std::vector<ChatMessage> messages = chat_messages_from_json(c.at("messages"));
      EXPECT_EQ(tok.encode(render_generation_prompt(format, messages)), c.at("ids").get<std::vector<int32_t>>())
          << folder << " " << c.at("name");
      ++checked;
    }
  }
  EXPECT_GE(checked, 9);
}

TEST(Chat, Qwen3MatchesTransformers) {
  if (!fs::exists(qwen3_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "no Qwen3 tokenizer at " << qwen3_dir() << " (no shared folder: see INGOT_SHARED_DIR in the README)";
  const BpeTokenizer tok = BpeTokenizer::from_file(qwen3_dir());
  const ChatFormat format = load_chat_format(qwen3_dir());
  EXPECT_EQ(format.name(), "chatml-qwen3");
  EXPECT_TRUE(format.default_system.empty());
  check_fixture("qwen3.json", tok, format, true);
}

// ChatML against transformers where CI can run it: a tokenizer trained for the fixtures (Qwen2's
// pre-tokenizer, NFC, the ChatML special tokens) under a template with a default system turn.
TEST(Chat, ChatmlFixtureTokenizerMatchesTransformers) {
  const std::string dir = fixtures() + "/chatml_tokenizer";
  const BpeTokenizer tok = BpeTokenizer::from_file(dir);
  const ChatFormat format = load_chat_format(dir);
  EXPECT_EQ(format.name(), "chatml");
  EXPECT_EQ(format.default_system, "You are a careful assistant. Answer briefly.");
  check_fixture("chatml.json", tok, format, true);
}

TEST(Chat, ChatmlDefaultSystemMatchesTransformers) {
  if (!fs::exists(qwen3_dir() + "/tokenizer.json"))
    GTEST_SKIP() << "no Qwen3 tokenizer at " << qwen3_dir() << " (no shared folder: see INGOT_SHARED_DIR in the README)";
  const BpeTokenizer tok = BpeTokenizer::from_file(qwen3_dir());
  const ChatFormat format = load_chat_format(fixtures() + "/chatml_default");
  EXPECT_EQ(format.name(), "chatml");
  EXPECT_EQ(format.default_system, "You are a careful assistant. Answer briefly.");
  check_fixture("chatml_default.json", tok, format, true);
}

// A non-special added token of Latin-1 letters stands for its text in the mask alignment: "héllo"
// was spelled h, 0xE9, l, l, o through the byte-level table, and the chat was refused as if the
// normalizer had changed it (a fuzzing review, 2026-12-02).
TEST(Chat, AddedTokenOfLatin1LettersAlignsWithItsText) {
  const std::string dir = test::temp_dir("chat_added_latin1");
  nlohmann::json tokenizer = read_json(fixtures() + "/chatml_tokenizer/tokenizer.json");
  const BpeTokenizer original = BpeTokenizer::from_file(fixtures() + "/chatml_tokenizer");
  const int32_t id = static_cast<int32_t>(original.vocab_size());
  tokenizer["added_tokens"].push_back({{"id", id}, {"content", "h\u00e9llo"}, {"single_word", false}, {"lstrip", false},
                                        {"rstrip", false}, {"normalized", false}, {"special", false}});
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  fs::copy_file(fixtures() + "/chatml_tokenizer/tokenizer_config.json", dir + "/tokenizer_config.json");
  const BpeTokenizer tok = BpeTokenizer::from_file(dir);
  const ChatFormat format = load_chat_format(dir);
  const std::vector<ChatMessage> messages = chat_messages_from_json(nlohmann::json::parse(
      R"([{"role": "user", "content": "say h\u00e9llo"}, {"role": "assistant", "content": "h\u00e9llo there"}])"));
  const TokenizedChat out = tokenize_chat(format, tok, messages, false);
  EXPECT_EQ(std::count(out.tokens.begin(), out.tokens.end(), id), 2);
  std::string trained;
  for (size_t i = 0; i < out.tokens.size(); ++i)
    if (out.loss_mask[i]) trained += token_bytes(tok, out.tokens[i]);
  EXPECT_EQ(trained, "h\u00e9llo there<|im_end|>");
}

// transformers >= 4.49 saves the template in chat_template.jinja beside a tokenizer_config.json
// without one ("has no chat_template" before).
TEST(Chat, TemplateFromChatTemplateJinja) {
  const std::string dir = test::temp_dir("chat_jinja");
  nlohmann::json config = read_json(fixtures() + "/llama3_tokenizer/tokenizer_config.json");
  const std::string tmpl = config.at("chat_template").get<std::string>();
  config.erase("chat_template");
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  std::ofstream(dir + "/chat_template.jinja") << tmpl;
  const ChatFormat from_jinja = load_chat_format(dir);
  const ChatFormat from_json = load_chat_format(fixtures() + "/llama3_tokenizer");
  EXPECT_EQ(from_jinja.name(), "llama3");
  EXPECT_EQ(from_jinja.bos_token, from_json.bos_token);
  fs::remove(dir + "/chat_template.jinja");
  const std::string msg = error_of([&] { load_chat_format(dir); });
  EXPECT_NE(msg.find("has no chat_template, and there is no chat_template.jinja beside it"), std::string::npos) << msg;
}

// Fields of the wrong type are named with the file (a bare JSON library error before): a bos_token
// whose content is not text, and named templates whose name or text is not a string.
TEST(Chat, MistypedTemplateFieldsAreNamed) {
  const std::string dir = test::temp_dir("chat_mistyped");
  nlohmann::json config = read_json(fixtures() + "/llama3_tokenizer/tokenizer_config.json");
  const std::string tmpl = config.at("chat_template").get<std::string>();
  config["bos_token"] = {{"content", 5}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  std::string msg = error_of([&] { load_chat_format(dir); });
  EXPECT_NE(msg.find(dir + "/tokenizer_config.json: bos_token must be a string or an object with a string \"content\", got {\"content\":5}"),
            std::string::npos) << msg;
  config["bos_token"] = "<|begin_of_text|>";
  config["chat_template"] = nlohmann::json::array({{{"name", 1}, {"template", tmpl}}, {{"name", "default"}, {"template", 2}}});
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  msg = error_of([&] { load_chat_format(dir); });
  EXPECT_NE(msg.find("the chat_template named \"default\" is not a string"), std::string::npos) << msg;
  config["chat_template"] = nlohmann::json::array({{{"name", 1}, {"template", 2}}, {{"name", "default"}, {"template", tmpl}}});
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  EXPECT_EQ(load_chat_format(dir).name(), "llama3");
  // Empty or missing templates are called that, not "not a string" (a review, 2026-12-03).
  config["chat_template"] = "";
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  msg = error_of([&] { load_chat_format(dir); });
  EXPECT_NE(msg.find(dir + "/tokenizer_config.json: chat_template is empty"), std::string::npos) << msg;
  config["chat_template"] = nlohmann::json::array({{{"name", "tool_use"}, {"template", tmpl}}});
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  msg = error_of([&] { load_chat_format(dir); });
  EXPECT_NE(msg.find("chat_template is a list of named templates, none named \"default\""), std::string::npos) << msg;
  config["chat_template"] = nlohmann::json::array({{{"name", "default"}, {"template", ""}}});
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  msg = error_of([&] { load_chat_format(dir); });
  EXPECT_NE(msg.find("the chat_template named \"default\" is empty"), std::string::npos) << msg;
}

// Default system turns and bos tokens as transformers renders them (a fuzzing review, 2026-12-02,
// compared with jinja2 under transformers' settings): each of these was dropped without a word.
TEST(Chat, TemplatesDefaultSystemAndBosAreRenderedAsWritten) {
  const std::vector<ChatMessage> chat = {{"user", "Hi", std::nullopt}, {"assistant", "Hello", std::nullopt}};
  const std::string turns = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n";
  auto render = [&](const std::string& tmpl, const std::string& bos) {
    return render_chat(chat_format_from_template(tmpl, bos, "t"), chat).text;
  };
  const std::string loop = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                           "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  // A default system turn in a double-quoted literal holding an apostrophe.
  EXPECT_EQ(render("{% if messages[0]['role'] != 'system' %}{{ \"<|im_start|>system\\nYou're a helpful assistant."
                   "<|im_end|>\\n\" }}{% endif %}" + loop, ""),
            "<|im_start|>system\nYou're a helpful assistant.<|im_end|>\n" + turns);
  // One written as template text, not as a string.
  EXPECT_EQ(render("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are {terse}.<|im_end|>\n{% endif %}" +
                   loop, ""),
            "<|im_start|>system\nYou are {terse}.<|im_end|>\n" + turns);
  // A system turn whose body is the conversation's own is no default (Qwen3's).
  EXPECT_EQ(render("{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + "
                   "'<|im_end|>\\n' }}{% endif %}" + loop, ""),
            turns);
  // Two different defaults cannot be told apart.
  const std::string two = error_of([&] {
    render("{{ '<|im_start|>system\\nA<|im_end|>\\n' }}{{ '<|im_start|>system\\nB<|im_end|>\\n' }}" + loop, "");
  });
  EXPECT_NE(two.find("chat template of t writes two different default system turns (\"A\" and \"B\")"), std::string::npos) << two;
  // ChatML that starts with bos_token (Hermes 3), and Llama 3 that writes its bos literally.
  EXPECT_EQ(render("{{ bos_token }}" + loop, "<|endoftext|>"), "<|endoftext|>" + turns);
  EXPECT_EQ(render(loop, "<|endoftext|>"), turns);
  EXPECT_EQ(render(loop, "<|im_start|>"), turns);  // a bos that is a control token is not looked for
  // ChatML bos only where the template writes it first: one that is also the eos written after each
  // turn, or an identifier that merely contains the word, is none (a review, 2026-12-02).
  EXPECT_TRUE(render(loop + "{{ '<|endoftext|>' }}", "<|endoftext|>").starts_with("<|im_start|>user"));
  EXPECT_EQ(render("{% if add_bos_token %}{% endif %}" + loop, "<s>"), turns);
  EXPECT_EQ(render("{{- '<s>' + '' }}" + loop, "<s>"), "<s>" + turns);
  // Python's string escapes in a literal (\u2019, as json.dumps writes a curly apostrophe), and a
  // template written with CRLF line ends, whose text Jinja reads with "\n".
  EXPECT_EQ(render("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou\\u2019re \\x41.<|im_end|>\\n' }}"
                   "{% endif %}" + loop, ""),
            "<|im_start|>system\nYou\u2019re A.<|im_end|>\n" + turns);
  EXPECT_EQ(render("{% if messages[0]['role'] != 'system' %}<|im_start|>system\r\nBe brief.<|im_end|>\n{% endif %}" + loop, ""),
            "<|im_start|>system\nBe brief.<|im_end|>\n" + turns);
  const ChatFormat llama = chat_format_from_template(
      "{{- '<|begin_of_text|>' }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
      "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}",
      "<|begin_of_text|>", "t");
  EXPECT_EQ(render_chat(llama, chat).text,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\nHello<|eot_id|>");
}

TEST(Chat, UnknownTemplateNamesSupportedFormats) {
  std::string msg = error_of([] {
    chat_format_from_template("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}",
                              "<s>", "mistral/tokenizer_config.json");
  });
  EXPECT_NE(msg.find("mistral/tokenizer_config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("llama3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("chatml"), std::string::npos) << msg;
  // QwQ-style: ChatML that strips the think block from every assistant turn. It rendered as Qwen3.
  msg = error_of([] {
    chat_format_from_template("{%- set content = message.content.split('</think>')[-1] %}<|im_start|>", "",
                              "qwq/tokenizer_config.json");
  });
  EXPECT_NE(msg.find("qwq/tokenizer_config.json: a ChatML template with <think> handling other than Qwen3's"),
            std::string::npos) << msg;
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
  EXPECT_NE(msg.find("\"messages\" is an object, not an array"), std::string::npos) << msg;
  msg = error_of([] { chat_messages_from_json(json::parse("[]")); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  // A tool call carries the answer outside "content": the text alone trained an empty answer.
  msg = error_of([] {
    chat_messages_from_json(json::parse(R"([{"role":"user","content":"Weather?"},{"role":"assistant","content":"",
        "tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]}])"));
  });
  EXPECT_NE(msg.find("message 1: \"tool_calls\" is not supported"), std::string::npos) << msg;
  msg = error_of([] {
    chat_messages_from_json(json::parse(R"([{"role":"assistant","content":"","function_call":{"name":"f"}}])"));
  });
  EXPECT_NE(msg.find("message 0: \"function_call\" is not supported"), std::string::npos) << msg;
  // An empty list or null, as datasets write on every message, is no call.
  EXPECT_EQ(chat_messages_from_json(json::parse(R"([{"role":"user","content":"a","tool_calls":[]},
      {"role":"assistant","content":"b","tool_calls":null}])")).size(), 2u);
  // Alpaca's earlier turns would be left out.
  msg = error_of([] {
    alpaca_messages_from_json(json::parse(R"({"instruction":"a","output":"b","history":[["q","r"]]})"));
  });
  EXPECT_NE(msg.find("\"history\" (earlier turns) is not supported"), std::string::npos) << msg;
  EXPECT_EQ(alpaca_messages_from_json(json::parse(R"({"instruction":"a","output":"b","history":[]})")).size(), 2u);
  msg = error_of([] {
    chat_messages_from_json(json::parse(R"([{"role":"user","content":[{"type":"text"}]}])"));
  });
  EXPECT_NE(msg.find("\"content\" is an array, not a string (multimodal content lists are not supported)"),
            std::string::npos) << msg;
  // The note on content lists only for a list (a fuzzing review, 2026-12-02).
  msg = error_of([] { chat_messages_from_json(json::parse(R"([{"role":"user","content":null}])")); });
  EXPECT_EQ(msg.substr(msg.find("\"content\"")), "\"content\" is null, not a string") << msg;
  msg = error_of([] { chat_messages_from_json(json::parse(R"([{"role":"user","content":7}])")); });
  EXPECT_EQ(msg.substr(msg.find("\"content\"")), "\"content\" is a number, not a string") << msg;
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

// ---------------------------------------------------------------- prepare --format chat / alpaca

namespace {

void write_file(const fs::path& path, std::string_view text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

const std::string kChatLines =
    R"({"messages": [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}]})"
    "\n\n"
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "bye"}, {"role": "assistant", "content": "Bye."}]})"
    "\n";

PrepareOptions chat_options(const std::string& dir, const std::string& input) {
  PrepareOptions o;
  o.inputs = {input};
  o.output_dir = dir + "/out";
  o.format = PrepareFormat::chat;
  o.chat_template = fixtures() + "/llama3_tokenizer";
  o.overwrite = true;
  return o;
}

}  // namespace

// chat_template.jinja beside tokenizer_config.json overrides the config's chat_template, as in
// transformers; the config's was used, and the data rendered with another template than the one
// the dataset, its checkpoints and exports then carried.
TEST(Chat, TemplateFileOverridesTheConfigsTemplate) {
  const std::string dir = test::temp_dir("chat_jinja_first");
  nlohmann::json config = read_json(fixtures() + "/chatml_tokenizer/tokenizer_config.json");
  const std::string with_default = config["chat_template"];
  config["chat_template"] = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                            "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  EXPECT_TRUE(load_chat_format(dir, "chatml").default_system.empty());
  std::ofstream(dir + "/chat_template.jinja") << with_default;
  EXPECT_EQ(load_chat_format(dir).default_system, "You are a careful assistant. Answer briefly.");
  EXPECT_EQ(chat_template_file_in_use(dir), dir + "/chat_template.jinja");
  // A config file of another name, which the user named (--chat-template custom.json), is taken as
  // written; the template file beside it serves only where it has no chat_template.
  std::ofstream(dir + "/custom.json") << config.dump();
  EXPECT_TRUE(load_chat_format(dir + "/custom.json", "chatml").default_system.empty());
  EXPECT_EQ(chat_template_file_in_use(dir + "/custom.json"), "");
  config.erase("chat_template");
  std::ofstream(dir + "/custom.json") << config.dump();
  EXPECT_EQ(load_chat_format(dir + "/custom.json").default_system, "You are a careful assistant. Answer briefly.");
  // A dataset carries the template file only where it is the one in use.
  write_file(dir + "/chat.jsonl", kChatLines);
  std::ofstream(dir + "/custom.json") << nlohmann::json(read_json(dir + "/tokenizer_config.json")).dump();
  PrepareOptions o = chat_options(dir, dir + "/chat.jsonl");
  o.chat_template = dir + "/custom.json";
  o.chat_format = "chatml";  // the plain ChatML loop of custom.json is no checked template
  o.tokenizer_file = fixtures() + "/chatml_tokenizer/tokenizer.json";
  prepare_dataset(o, BpeTokenizer::from_file(fixtures() + "/chatml_tokenizer"));
  EXPECT_TRUE(fs::exists(dir + "/out/tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(dir + "/out/chat_template.jinja"));
  EXPECT_TRUE(load_chat_format(dir + "/out", "chatml").default_system.empty());
  EXPECT_EQ(read_json(dir + "/out/meta.json").at("chat_template_checked"), false);  // rendered by --chat-format
}

TEST(PrepareChat, WritesMaskedDocumentsMatchingTheChatFormat) {
  const std::string dir = test::temp_dir("prepare_chat");
  write_file(dir + "/chat.jsonl", kChatLines);
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  const ChatFormat format = load_chat_format(fixtures() + "/llama3_tokenizer");
  std::ostringstream log;
  PrepareOptions o = chat_options(dir, dir + "/chat.jsonl");
  o.log = &log;
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 2);
  EXPECT_EQ(r.chat_format, "llama3");
  Shard s(dir + "/out/train-00000.bin");
  ASSERT_TRUE(s.has_loss_mask());
  ASSERT_EQ(s.num_documents(), 2);
  std::vector<int32_t> tokens(s.num_tokens());
  s.read_tokens(0, s.num_tokens(), tokens.data());
  const auto mask = s.loss_mask();
  std::vector<int32_t> expected_tokens;
  std::vector<uint8_t> expected_mask;
  std::istringstream lines(kChatLines);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    const auto msgs = chat_messages_from_json(nlohmann::json::parse(line)["messages"]);
    const TokenizedChat t = tokenize_chat(format, tok, msgs, false);
    EXPECT_EQ(s.document_starts()[expected_tokens.empty() ? 0 : 1], expected_tokens.size());
    expected_tokens.insert(expected_tokens.end(), t.tokens.begin(), t.tokens.end());
    expected_mask.insert(expected_mask.end(), t.loss_mask.begin(), t.loss_mask.end());
  }
  EXPECT_EQ(tokens, expected_tokens);
  EXPECT_EQ(std::vector<uint8_t>(mask.begin(), mask.end()), expected_mask);
  EXPECT_EQ(r.trained_tokens, std::count(expected_mask.begin(), expected_mask.end(), 1));
  EXPECT_NE(log.str().find("masked fraction"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("truncated 0, dropped 0"), std::string::npos) << log.str();
  std::ifstream meta_in(dir + "/out/meta.json");
  const auto meta = nlohmann::json::parse(meta_in);
  EXPECT_EQ(meta.at("chat_format"), "llama3");
  EXPECT_EQ(meta.at("chat_template_checked"), true);
  EXPECT_EQ(meta.at("loss_mask"), true);

  o.train_on_inputs = true;
  const PrepareReport all = prepare_dataset(o, tok);
  EXPECT_EQ(all.trained_tokens, all.num_tokens);
}

// --chat-date-string pins a llama3.1 template's date (as apply_chat_template's date_string), so a
// dataset prepared on another day has the same tokens; meta.json and the report give the date. Other
// formats write no date and refuse it.
TEST(PrepareChat, ChatDateStringPinsTheLlama31Date) {
  const std::string dir = test::temp_dir("prepare_chat_date");
  write_file(dir + "/chat.jsonl", kChatLines);
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  std::ostringstream log;
  PrepareOptions o = chat_options(dir, dir + "/chat.jsonl");
  o.chat_template = fixtures() + "/llama31";
  o.chat_date_string = "1 Feb 2031";
  o.log = &log;
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.chat_format, "llama3.1");
  EXPECT_NE(log.str().find("chat format llama3.1 (Today Date: 1 Feb 2031); loss on"), std::string::npos) << log.str();
  EXPECT_EQ(read_json(dir + "/out/meta.json").at("chat_date_string"), "1 Feb 2031");
  Shard s(dir + "/out/train-00000.bin");
  std::vector<int32_t> tokens(s.num_tokens());
  s.read_tokens(0, s.num_tokens(), tokens.data());
  std::string text;
  for (const int32_t id : tokens) text += token_bytes(tok, id);
  EXPECT_NE(text.find("Today Date: 1 Feb 2031\n\n<|eot_id|><|start_header_id|>user"), std::string::npos) << text;
  EXPECT_NE(text.find("Today Date: 1 Feb 2031\n\nBe brief.<|eot_id|>"), std::string::npos) << text;

  o.chat_template = fixtures() + "/llama3_tokenizer";
  std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("--chat-date-string is for templates that write a date (llama3.1); the chat template of " +
                     o.chat_template + " reads as llama3"), std::string::npos) << msg;
  o.chat_template = fixtures() + "/llama31";
  o.chat_date_string = "1 Feb\n2031";
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("holds a line break"), std::string::npos) << msg;
}

// An earlier chat dataset inside an input directory adds nothing: its shards are binary and are
// passed over as text mode passes them; chat mode read them as JSON Lines and stopped at a NUL byte.
TEST(PrepareChat, AnEarlierDatasetInTheInputDirectoryIsPassedOver) {
  const std::string dir = test::temp_dir("prepare_chat_earlier");
  fs::create_directories(dir + "/in");
  write_file(dir + "/in/chat.jsonl", kChatLines);
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  PrepareOptions earlier = chat_options(dir, dir + "/in/chat.jsonl");
  earlier.output_dir = dir + "/in/earlier";
  const PrepareReport first = prepare_dataset(earlier, tok);
  const PrepareReport again = prepare_dataset(chat_options(dir, dir + "/in"), tok);
  EXPECT_EQ(again.num_documents, first.num_documents);
  EXPECT_EQ(again.num_tokens, first.num_tokens);
  EXPECT_EQ(again.skipped_binary_files, 1);
  EXPECT_EQ(again.first_skipped_binary_file, dir + "/in/earlier/train-00000.bin");
}

// A record whose bytes the tokenizer drops (no token for 0xD0, no unk_token) cannot have its mask
// aligned: the error names that byte and the record's own line, even when a later record's batch
// finds it (it named the later line and blamed the normalizer), and --skip-invalid-json skips it
// like a bad line (it could not) without writing the batch's other records twice.
TEST(PrepareChat, ARecordWhoseBytesTheTokenizerDropsIsNamedOrSkipped) {
  const std::string dir = test::temp_dir("prepare_chat_dropped_byte");
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(fixtures() + "/chatml_tokenizer/" + file, dir + "/" + file);
  nlohmann::json tokenizer = read_json(dir + "/tokenizer.json");
  tokenizer["model"]["vocab"].erase("\u00d0");  // byte 0xD0, which starts Cyrillic letters
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  const BpeTokenizer tok = BpeTokenizer::from_file(dir);
  std::string lines;
  for (int i = 1; i <= 1100; ++i)  // past one batch of 1024, so a later record's batch finds line 4
    lines += std::string(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":")") +
             (i == 4 ? "\u041f\u0440\u0438\u0432\u0435\u0442" : "hello") + "\"}]}\n";
  write_file(dir + "/chat.jsonl", lines);
  PrepareOptions o = chat_options(dir, dir + "/chat.jsonl");
  o.chat_template = dir;
  const std::string message = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(message.find("prepare: " + dir + "/chat.jsonl:4: chat: the conversation holds byte 0xD0, which the "
                         "tokenizer has no token for"), std::string::npos) << message;
  o.skip_invalid_json = true;
  const PrepareReport report = prepare_dataset(o, tok);
  EXPECT_EQ(report.skipped_json_lines, 1);
  EXPECT_EQ(report.num_documents, 1099);
  EXPECT_EQ(Shard(dir + "/out/train-00000.bin").num_documents(), 1099u);
  // Such a byte in the template's own default system turn is the template's, not the records': it
  // was counted against every record without a system message, and those were skipped.
  nlohmann::json config = read_json(dir + "/tokenizer_config.json");
  std::string tmpl = config["chat_template"];
  tmpl.replace(tmpl.find("You are a careful"), 17, "\u041f\u0440\u0438 a careful");
  config["chat_template"] = tmpl;
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  o.chat_format = "chatml";
  const std::string refused = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(refused.find("the default system turn of the chat template of " + dir + " holds byte 0xD0, which the tokenizer drops"),
            std::string::npos) << refused;
}

TEST(PrepareChat, AlpacaAndOverflow) {
  const std::string dir = test::temp_dir("prepare_alpaca");
  write_file(dir + "/a.jsonl",
             R"({"instruction": "Give a synonym for quick.", "input": "", "output": "Fast."})"
             "\n"
             R"({"instruction": "Summarise the text.", "input": "Cats sleep a lot. They also purr and purr and purr.", "output": "Cats sleep and purr."})"
             "\n");
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  PrepareOptions o = chat_options(dir, dir + "/a.jsonl");
  o.format = PrepareFormat::alpaca;
  const PrepareReport full = prepare_dataset(o, tok);
  ASSERT_EQ(full.num_documents, 2);
  Shard s(dir + "/out/train-00000.bin");
  const int64_t first_len = static_cast<int64_t>(s.document_starts()[1]);
  const int64_t second_len = s.num_tokens() - first_len;
  ASSERT_GT(second_len, first_len);
  o.max_seq_len = second_len - 2;  // the second sample is too long: cut inside its answer
  const PrepareReport truncated = prepare_dataset(o, tok);
  EXPECT_EQ(truncated.truncated, 1);
  EXPECT_EQ(truncated.num_tokens, first_len + second_len - 2);
  EXPECT_EQ(truncated.trained_tokens, full.trained_tokens - 2);
  o.overflow = OverflowPolicy::drop;
  const PrepareReport dropped = prepare_dataset(o, tok);
  EXPECT_EQ(dropped.dropped, 1);
  EXPECT_EQ(dropped.num_documents, 1);
  o.max_seq_len = 8;  // truncated before the answer: no trained token left, dropped
  o.overflow = OverflowPolicy::truncate;
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("2 documents dropped"), std::string::npos) << msg;
}

// A sample cut before its answer is dropped, and counted as dropped only: the report and meta.json
// counted it as truncated too, so "truncated" was more than the truncated samples in the shards.
TEST(PrepareChat, TruncatedCountsOnlyTheSamplesKept) {
  const std::string dir = test::temp_dir("prepare_truncated_count");
  write_file(dir + "/a.jsonl",
             R"({"instruction": "Read this long question about cats and dogs and birds and fish and more.", "input": "", "output": "No."})"
             "\n"
             R"({"instruction": "Hi.", "input": "", "output": "Cats sleep a lot, and they also purr and purr and purr and purr."})"
             "\n");
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  PrepareOptions o = chat_options(dir, dir + "/a.jsonl");
  o.format = PrepareFormat::alpaca;
  ASSERT_EQ(prepare_dataset(o, tok).num_documents, 2);
  Shard s(dir + "/out/train-00000.bin");
  const auto mask = s.loss_mask();
  const int64_t second = static_cast<int64_t>(s.document_starts()[1]), total = s.num_tokens();
  auto first_trained = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      if (mask[i]) return i - begin;
    return end - begin;
  };
  const int64_t answer_a = first_trained(0, second), answer_b = first_trained(second, total);
  ASSERT_LT(answer_b + 1, answer_a) << "the second answer must start well before the first";
  ASSERT_LT(answer_a, total - second) << "the second sample must outlast the limit";
  o.max_seq_len = answer_a;  // A: cut before its answer, dropped; B: cut inside its answer, kept
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.num_documents, 1);
  EXPECT_EQ(r.dropped_no_target, 1);
  EXPECT_EQ(r.truncated, 1);
  EXPECT_EQ(nlohmann::json::parse(test::read_file(dir + "/out/meta.json")).at("truncated"), 1);
}

// A template from another model family than the tokenizer: its control tokens would be split into
// plain text and trained as such, and a model trained on it never learns to stop.
TEST(PrepareChat, TemplateWhoseControlTokensTheTokenizerLacksIsRefused) {
  const std::string dir = test::temp_dir("prepare_chat_mismatch");
  write_file(dir + "/chat.jsonl", kChatLines);
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  PrepareOptions o = chat_options(dir, dir + "/chat.jsonl");
  o.chat_template = fixtures() + "/chatml_default";
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("(chatml) writes <|im_start|>, which tokenizer"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir + "/out/train-00000.bin"));
}

// A control token must be one token where encode() finds it in text: an ordinary vocabulary entry
// (Qwen's vocabulary holds "<s>") is split into pieces, and passed the check that looked it up.
TEST(PrepareChat, ControlTokenThatIsNoAddedTokenIsRefused) {
  const std::string dir = test::temp_dir("prepare_chat_plain_bos");
  nlohmann::json tokenizer = read_json(fixtures() + "/chatml_tokenizer/tokenizer.json");
  tokenizer["model"]["vocab"]["<s>"] = tokenizer["model"]["vocab"].size() + tokenizer["added_tokens"].size();
  std::ofstream(dir + "/tokenizer.json") << tokenizer.dump();
  nlohmann::json config = read_json(fixtures() + "/chatml_tokenizer/tokenizer_config.json");
  config["bos_token"] = "<s>";
  config["chat_template"] = "{{ bos_token }}" + config["chat_template"].get<std::string>();
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  const BpeTokenizer tok = BpeTokenizer::from_file(dir);
  ASSERT_GE(tok.token_to_id("<s>"), 0);
  ASSERT_GT(tok.encode("<s>").size(), 1u);
  write_file(dir + "/chat.jsonl", kChatLines);
  PrepareOptions o = chat_options(dir, dir + "/chat.jsonl");
  o.chat_template = dir;
  o.chat_format = "chatml";
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("(chatml) writes <s>, which tokenizer"), std::string::npos) << msg;
}

// Markers alone do not say how a template renders: one whose rendering was not checked against
// transformers' is refused, naming its hash and --chat-format (a review of 36 public templates,
// 2026-12-02, found 21 rendered otherwise: other separators, role names, trimming, default turns).
TEST(PrepareChat, UncheckedTemplateIsRefusedUnlessItsFormatIsNamed) {
  const std::string dir = test::temp_dir("prepare_chat_unchecked");
  nlohmann::json config = read_json(fixtures() + "/chatml_tokenizer/tokenizer_config.json");
  config["chat_template"] = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>' + "
                            "message['content'] + '<|im_end|>'}}{% endfor %}";  // Phi-4's separator
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  const std::string hash = [&] {
    char hex[24];
    std::snprintf(hex, sizeof hex, "0x%016llx",
                  static_cast<unsigned long long>(chat_template_hash(config["chat_template"].get<std::string>())));
    return std::string(hex);
  }();
  std::string msg = error_of([&] { load_chat_format(dir); });
  EXPECT_NE(msg.find("the chat template of " + dir + "/tokenizer_config.json (" + hash + ") reads as chatml, but it is "
                     "not one whose rendering Ingot has checked against transformers'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("or pass --chat-format chatml to render it as chatml anyway"), std::string::npos) << msg;
  EXPECT_EQ(load_chat_format(dir, "chatml").name(), "chatml");
  msg = error_of([&] { load_chat_format(dir, "llama3"); });
  EXPECT_NE(msg.find("--chat-format llama3, but the chat template of " + dir + "/tokenizer_config.json reads as chatml"),
            std::string::npos) << msg;
  // The checked templates load as they are, also from a .jinja saved with a final CRLF (Jinja drops
  // a final newline and reads CRLF as LF; so does the hash, FNV-1a 64 of the text so read).
  EXPECT_EQ(load_chat_format(fixtures() + "/chatml_tokenizer").name(), "chatml");
  EXPECT_EQ(load_chat_format(fixtures() + "/llama3_tokenizer").name(), "llama3");
  EXPECT_EQ(chat_template_hash(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(chat_template_hash("a"), 0xaf63dc4c8601ec8cull);
  const std::string saved = read_json(fixtures() + "/chatml_tokenizer/tokenizer_config.json")["chat_template"];
  EXPECT_EQ(chat_template_hash(saved + "\r\n"), chat_template_hash(saved));
  EXPECT_EQ(chat_template_hash("a\r\nb\rc"), chat_template_hash("a\nb\nc"));
  const std::string jinja_dir = test::temp_dir("prepare_chat_crlf");
  config.erase("chat_template");
  std::ofstream(jinja_dir + "/tokenizer_config.json") << config.dump();
  std::ofstream(jinja_dir + "/chat_template.jinja", std::ios::binary) << saved << "\r\n";
  EXPECT_EQ(load_chat_format(jinja_dir).default_system, "You are a careful assistant. Answer briefly.");
}

TEST(PrepareChat, BadInputNamesFileLineAndProblem) {
  const std::string dir = test::temp_dir("prepare_chat_bad");
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  const std::string good =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";
  auto expect_error = [&](const std::string& name, const std::string& text,
                          std::vector<std::string> parts) {
    const std::string file = dir + "/" + name;
    write_file(file, text);
    PrepareOptions o = chat_options(dir, file);
    const std::string msg = error_of([&] { prepare_dataset(o, tok); });
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
    return file;
  };
  // Unknown role, named with FILE:LINE; skipped and counted with skip_invalid_json.
  const std::string role_file = expect_error(
      "role.jsonl",
      good + "\n" +
          R"({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]})" +
          "\n",
      {"role.jsonl:2", "unknown role \"tool\""});
  PrepareOptions o = chat_options(dir, role_file);
  o.skip_invalid_json = true;
  const PrepareReport r = prepare_dataset(o, tok);
  EXPECT_EQ(r.skipped_json_lines, 1);
  EXPECT_EQ(r.num_documents, 1);
  // Missing fields.
  expect_error("nomsg.jsonl", good + "\n{\"conversation\": []}\n", {"nomsg.jsonl:2", "\"messages\""});
  expect_error("nocontent.jsonl", R"({"messages": [{"role": "user"}]})" "\n",
               {"nocontent.jsonl:1", "no \"content\""});
  // Malformed JSON and invalid UTF-8.
  expect_error("broken.jsonl", good + "\n{\"messages\": [\n", {"broken.jsonl:2", "invalid JSON"});
  expect_error("utf8.jsonl",
               std::string(R"({"messages": [{"role": "user", "content": "caf)") + "\xff" +
                   R"("}, {"role": "assistant", "content": "x"}]})" + "\n",
               {"utf8.jsonl:1", "invalid UTF-8"});
  // Empty files.
  expect_error("empty.jsonl", "", {"empty.jsonl", "is empty"});
  expect_error("blank.jsonl", "\n  \n", {"blank.jsonl", "no JSONL records"});
  // The byte tokenizer has no chat special tokens; an unknown template names the formats.
  write_file(dir + "/ok.jsonl", good + "\n");
  ByteTokenizer bytes;
  std::string msg = error_of([&] { prepare_dataset(chat_options(dir, dir + "/ok.jsonl"), bytes); });
  EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
  write_file(dir + "/tmpl/tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  o = chat_options(dir, dir + "/ok.jsonl");
  o.chat_template = dir + "/tmpl";
  msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("llama3"), std::string::npos) << msg;
}

TEST(PrepareChat, TextWithBpeTokenizerNamesInvalidUtf8Line) {
  const std::string dir = test::temp_dir("prepare_text_utf8");
  write_file(dir + "/in.txt", "first doc\n%\nsecond\nhas \xc3( bad\n");
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  PrepareOptions o;
  o.inputs = {dir + "/in.txt"};
  o.output_dir = dir + "/out";
  o.doc_separator = "%";
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  // The line holding the bad byte (the document starts at line 3), with the byte and its column.
  EXPECT_NE(msg.find("in.txt:4: invalid UTF-8 (byte 0xC3) at column 5"), std::string::npos) << msg;
}

// Chat or alpaca records prepared as text: the error says which --format they need.
TEST(PrepareChat, ChatRecordsWithoutFormatChatNameIt) {
  const std::string dir = test::temp_dir("prepare_chat_as_text");
  write_file(dir + "/chat.jsonl", kChatLines);
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  PrepareOptions o;
  o.inputs = {dir + "/chat.jsonl"};
  o.output_dir = dir + "/out";
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("no string field \"text\" (chat data: --format chat)"), std::string::npos) << msg;
}

// Text documents end with the tokenizer's eos_token, which for an instruct model's tokenizer is its
// end of turn (this fixture's, like Llama 3 Instruct's, is <|eot_id|>); eos_token picks another.
TEST(PrepareChat, TextDocumentsEndWithTheChosenEosToken) {
  const std::string dir = test::temp_dir("prepare_text_eos");
  write_file(dir + "/in.txt", "first doc\n%\nsecond\n");
  const BpeTokenizer tok = BpeTokenizer::from_file(fixtures() + "/llama3_tokenizer");
  PrepareOptions o;
  o.inputs = {dir + "/in.txt"};
  o.output_dir = dir + "/out";
  o.doc_separator = "%";
  o.overwrite = true;
  auto last_tokens = [&] {
    Shard s(dir + "/out/train-00000.bin");
    std::vector<int32_t> tokens(s.num_tokens());
    s.read_tokens(0, s.num_tokens(), tokens.data());
    const int64_t second = static_cast<int64_t>(s.document_starts()[1]);
    return std::pair{tokens[second - 1], tokens.back()};
  };
  prepare_dataset(o, tok);
  EXPECT_EQ(last_tokens(), std::pair(tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|eot_id|>")));
  o.eos_token = "<|end_of_text|>";
  prepare_dataset(o, tok);
  const int32_t end_of_text = tok.token_to_id("<|end_of_text|>");
  ASSERT_GE(end_of_text, 0);
  EXPECT_EQ(last_tokens(), std::pair(end_of_text, end_of_text));
  EXPECT_EQ(nlohmann::json::parse(test::read_file(dir + "/out/meta.json")).at("eos_id"), end_of_text);
  o.eos_token = "<|no_such_token|>";
  const std::string msg = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(msg.find("eos_token \"<|no_such_token|>\" is not a token of"), std::string::npos) << msg;
  // An ordinary token is refused: text holding it would end a document there. It was accepted.
  o.eos_token = "a";
  ASSERT_GE(tok.token_to_id("a"), 0);
  const std::string ordinary = error_of([&] { prepare_dataset(o, tok); });
  EXPECT_NE(ordinary.find("eos_token \"a\" is an ordinary token of"), std::string::npos) << ordinary;
  EXPECT_NE(ordinary.find("give a special token (the tokenizer's own is \"<|eot_id|>\")"), std::string::npos) << ordinary;
  // The tokenizer's own end-of-text token is taken as the flag, whatever its flags say (without
  // the flag it is the default).
  const std::string tokenizer_dir = fixtures() + "/llama3_tokenizer";
  nlohmann::json json = nlohmann::json::parse(test::read_file(tokenizer_dir + "/tokenizer.json"));
  for (nlohmann::json& added : json["added_tokens"])
    if (added["content"] == "<|eot_id|>") added["special"] = false;
  fs::create_directories(dir + "/plain_eos");
  std::ofstream(dir + "/plain_eos/tokenizer.json") << json.dump();
  std::ofstream(dir + "/plain_eos/tokenizer_config.json") << test::read_file(tokenizer_dir + "/tokenizer_config.json");
  const BpeTokenizer plain = BpeTokenizer::from_file(dir + "/plain_eos/tokenizer.json");
  ASSERT_FALSE(plain.is_special(plain.eos_id()));
  o.eos_token = "<|eot_id|>";
  prepare_dataset(o, plain);
  EXPECT_EQ(last_tokens(), std::pair(tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|eot_id|>")));
}
