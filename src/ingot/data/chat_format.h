// Chat formats: a conversation (messages of role system / user / assistant) rendered into the
// token ids a model's chat template produces, plus a per-token loss mask.
//
// Built-in formats, chosen by its markers from chat_template.jinja beside tokenizer_config.json
// (which transformers reads first), else from the config's `chat_template`:
//   llama3  ("<|start_header_id|>"): [bos_token] then per message
//           "<|start_header_id|>ROLE<|end_header_id|>\n\n" + trim(content) + "<|eot_id|>"
//           (Meta-Llama-3-Instruct; content trimmed of Unicode whitespace as Jinja's `trim`).
//   llama3.1 (llama3 markers and "Cutting Knowledge Date"; Llama 3.1, 3.2 and 3.3 Instruct): llama3,
//           except that every conversation opens with a system turn whose body is
//           "Cutting Knowledge Date: K\nToday Date: D\n\n" + the trimmed first system message
//           ("" when the conversation has none). K is the template's literal; D is today's date
//           where the template calls strftime_now (as transformers renders it), else the
//           template's literal date_string; prepare and generate can pin it (--chat-date-string).
//   chatml  ("<|im_start|>"): [bos_token] then per message "<|im_start|>ROLE\n" + content +
//           "<|im_end|>\n". Qwen2.5 flavour: a template holding a literal default system turn
//           ('<|im_start|>system\n...<|im_end|>\n' in one string or in its text) uses it when the
//           conversation has no system message. Qwen3 flavour (the template mentions "</think>"): an assistant turn's
//           content is split at "</think>" into reasoning and answer; assistant turns after the
//           last user turn render "<think>\nREASONING\n</think>\n\n" + answer when they are the
//           final message or have reasoning (the final one gets an empty think block), earlier
//           ones render the answer only; `reasoning_content` on a message overrides the split.
// Generation prompts (the assistant header after the conversation) only through
// render_generation_prompt. Not supported: tools and tool calls (Llama 3.1's "Environment: ipython"
// lines), the "tool" and "ipython" roles, multimodal content lists. Any other template is an error
// naming the supported formats.
//
// Invariants:
//   - tokens equal transformers' apply_chat_template(messages, tokenize=True) for the same
//     tokenizer (checked on fixtures by tests/cpu/test_chat.cpp);
//   - the loss mask (1: trained) covers exactly what the model generates after the generation
//     prompt of each assistant turn: the rendered assistant body (think block included) and the
//     end-of-turn token (<|eot_id|> / <|im_end|>), not the newline after it. A token whose bytes
//     straddle a trained span and untrained text (e.g. "\n\n" where the content starts with "\n")
//     is trained. train_on_inputs sets every mask byte to 1.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ingot::data {

class BpeTokenizer;

enum class ChatFormatKind { llama3, chatml };

struct ChatFormat {
  ChatFormatKind kind = ChatFormatKind::chatml;
  std::string bos_token;       // text prepended to each conversation ("" for none)
  std::string default_system;  // chatml: system content used when none is given ("" for none)
  bool think_blocks = false;   // chatml: Qwen3 reasoning handling
  // llama3.1: the opening system turn's "Cutting Knowledge Date: " (e.g. "December 2023") and
  // "Today Date: " (e.g. "26 Jul 2024"). knowledge_date is "" for plain llama3.
  std::string knowledge_date;
  std::string date_string;     // callers may pin it, as apply_chat_template's date_string does
  bool checked = false;        // load_chat_format: the template is one of kCheckedTemplates (not forced)
  std::string name() const;    // "llama3", "llama3.1", "chatml", "chatml-qwen3"
  bool dated() const { return !knowledge_date.empty(); }  // llama3.1: its system turn gives a date
  std::string end_of_turn() const;  // "<|eot_id|>" or "<|im_end|>"
  // The control tokens the rendering writes (bos_token included when set): each must be one
  // token of the tokenizer, or the text would be trained as plain characters.
  std::vector<std::string> control_tokens() const;
};

// Detects the format of a Jinja chat template. bos_token: the tokenizer's bos_token ("" when
// null). source names the template in error messages.
ChatFormat chat_format_from_template(std::string_view chat_template, const std::string& bos_token,
                                     const std::string& source);
// Reads `chat_template` and `bos_token` from a tokenizer_config.json (or a folder holding one), the
// template from the chat_template.jinja beside it where chat_template_file_in_use names that.
// Markers alone cannot tell a template's separators, trimming and default turns: only a template
// whose rendering was checked against transformers' (kCheckedTemplates, by the hash of its text;
// tools/check_chat_template.py) is taken as is. Any other is refused, unless `chat_format` names the
// built-in format ("chatml", "chatml-qwen3", "llama3", "llama3.1") to render it with, which must be the one its
// markers give: the user takes that rendering knowingly.
ChatFormat load_chat_format(const std::string& path, const std::string& chat_format = "");
// Pins a llama3.1 format's date (--chat-date-string of `command`, prepare or generate): an error
// naming the template `source` where the format writes no date or the date holds a line break.
void pin_chat_date(ChatFormat* format, const std::string& date, const std::string& command, const std::string& source);
// The first of format.control_tokens() that `tokenizer` does not read as one token (an added token
// encode() finds whole in text: an ordinary vocabulary entry, such as Qwen's "<s>", is split into
// pieces and would be read as plain text); "" when it reads every one whole.
std::string first_split_control_token(const ChatFormat& format, const BpeTokenizer& tokenizer);
// FNV-1a 64 of a template's text: how kCheckedTemplates knows it.
uint64_t chat_template_hash(std::string_view chat_template);
// The chat_template.jinja that load_chat_format reads the template from, as transformers reads a
// model folder: the one beside a tokenizer_config.json, which overrides its chat_template; beside a
// config file of another name, only where that file has none. "" when the config's own is read.
std::string chat_template_file_in_use(const std::string& path);

struct ChatMessage {
  std::string role;     // system | user | assistant
  std::string content;
  std::optional<std::string> reasoning_content;  // Qwen3 only
};

// Validates a JSON `messages` array. Throws ingot::Error describing the problem (message index,
// missing field, unknown role named) without a file name: callers add FILE:LINE.
std::vector<ChatMessage> chat_messages_from_json(const nlohmann::json& messages);
// An alpaca record {instruction, input (optional), output} as a user turn (instruction, plus
// "\n\n" + input when input is non-empty) and an assistant turn (output). An optional string
// "system" field becomes a system turn. Throws like chat_messages_from_json.
std::vector<ChatMessage> alpaca_messages_from_json(const nlohmann::json& record);

struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained;  // byte spans [begin, end) of text, ascending
};
RenderedChat render_chat(const ChatFormat& format, std::span<const ChatMessage> messages);
// The conversation followed by the header of the assistant's next turn, as apply_chat_template(
// messages, add_generation_prompt=True) renders it: what a model completes to answer. (Qwen3's
// "<think>" is the model's to write: transformers adds an empty think block only with
// enable_thinking=False.)
std::string render_generation_prompt(const ChatFormat& format, std::span<const ChatMessage> messages);

struct TokenizedChat {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;  // (tokens.size(),) 0/1
};

// The loss mask for ids = tokenizer.encode(rendered.text). Returns false when the tokens' bytes do
// not spell rendered.text (the tokenizer normalized it), true after filling `out`.
bool align_chat_mask(const RenderedChat& rendered, std::vector<int32_t> ids,
                     const BpeTokenizer& tokenizer, bool train_on_inputs, TokenizedChat* out);

// Renders, encodes and masks one conversation. When the tokenizer's normalizer changes the text
// (e.g. NFC on decomposed input), the message contents are NFC-normalized and rendered again.
TokenizedChat tokenize_chat(const ChatFormat& format, const BpeTokenizer& tokenizer,
                            std::span<const ChatMessage> messages, bool train_on_inputs);

// The bytes a token id stands for (byte-level alphabet decoded; added tokens literally).
std::string token_bytes(const BpeTokenizer& tokenizer, int32_t id);

}  // namespace ingot::data
