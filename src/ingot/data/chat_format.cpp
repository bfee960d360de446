#include "ingot/data/chat_format.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ingot/core/broken_link.h"
#include "ingot/core/error.h"
#include "ingot/core/text.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/data/unicode_nfc.h"
#include "ingot/io/json_util.h"

namespace ingot::data {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kSupported =
    "supported: llama3 (a template with <|start_header_id|>), llama3.1 (<|start_header_id|> and \"Cutting Knowledge "
    "Date\"), chatml / Qwen2.5 / Qwen3 (a template with <|im_start|>)";

// Python's str.isspace(), which Jinja's `trim` (str.strip()) uses: White_Space plus U+001C..1F.
bool python_is_space(char32_t c) { return unicode_is_whitespace(c) || (c >= 0x1C && c <= 0x1F); }

// Python's s.strip() on valid UTF-8.
std::string_view python_strip(std::string_view s) {
  size_t pos = 0, first = std::string_view::npos, last_end = 0;
  while (pos < s.size()) {
    const size_t at = pos;
    const char32_t c = utf8_next(s, &pos);
    if (!python_is_space(c)) {
      if (first == std::string_view::npos) first = at;
      last_end = pos;
    }
  }
  if (first == std::string_view::npos) return {};
  return s.substr(first, last_end - first);
}

std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Template text with its line ends as Jinja reads them: "\r\n" and "\r" become "\n".
std::string jinja_newlines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    out += text[i] == '\r' ? '\n' : text[i];
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
  }
  return out;
}

// A Python string literal's body with its escapes undone, as Jinja reads it: \n \t \r \\ \' \"
// \xNN \uNNNN \UNNNNNNNN (a scalar value) and octal; any other escape (\N{...} too) keeps its
// backslash, as Python does for an unknown one.
std::string python_string_body(std::string_view body) {
  std::string out;
  auto hex = [&](size_t at, size_t digits, uint32_t* value) {
    if (at + digits > body.size()) return false;
    *value = 0;
    for (size_t k = at; k < at + digits; ++k) {
      const char h = body[k];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) return false;
      *value = *value * 16 + static_cast<uint32_t>(d);
    }
    return true;
  };
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char e = body[++i];
    uint32_t code = 0;
    const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits && hex(i + 1, digits, &code) && code <= 0x10FFFF && (code < 0xD800 || code > 0xDFFF)) {
      utf8_append(&out, static_cast<char32_t>(code));
      i += digits;
    } else if (e >= '0' && e <= '7') {
      size_t k = i;
      for (code = 0; k < body.size() && k < i + 3 && body[k] >= '0' && body[k] <= '7'; ++k) code = code * 8 + (body[k] - '0');
      utf8_append(&out, static_cast<char32_t>(code));
      i = k - 1;
    } else if (e == 'n' || e == 't' || e == 'r' || e == '\\' || e == '\'' || e == '"') {
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
    } else if (e != '\n') {  // a backslash before a newline joins the lines
      out += '\\';
      out += e;
    }
  }
  return out;
}

bool is_identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The text a Jinja template writes as it stands: its raw text between tags (newlines as "\n", as
// Jinja normalises them), and the string literals inside {{ }} and {% %} with their escapes undone
// (comments {# #} dropped). Enough to find a literal turn however it is quoted or written; not a
// Jinja parser.
struct TemplateLiterals {
  std::vector<std::string> texts;
  bool names_bos_token = false;  // the identifier bos_token appears inside a tag
  // What the template writes first: the first raw text that is not whitespace before any {{ }}, or
  // else the first {{ }} expression, as written ("bos_token", "'<s>' + ...").
  std::string first_output;
};
TemplateLiterals template_literals(std::string_view tmpl) {
  auto next_tag = [&](size_t from) {  // "{{", "{%" or "{#"; a lone '{' is text
    for (size_t k = tmpl.find('{', from); k != std::string_view::npos; k = tmpl.find('{', k + 1))
      if (k + 1 < tmpl.size() && (tmpl[k + 1] == '{' || tmpl[k + 1] == '%' || tmpl[k + 1] == '#')) return k;
    return tmpl.size();
  };
  TemplateLiterals out;
  bool first_found = false;
  for (size_t i = 0; i < tmpl.size();) {
    const size_t tag = next_tag(i);
    if (tag > i) {
      std::string text = jinja_newlines(tmpl.substr(i, tag - i));
      const bool blank = std::all_of(text.begin(), text.end(), [](char ch) { return std::isspace(static_cast<unsigned char>(ch)); });
      if (!first_found && !blank) first_found = true, out.first_output = text;
      out.texts.push_back(std::move(text));
    }
    if (tag == tmpl.size()) break;
    const char kind = tmpl[tag + 1];
    if (kind == '#') {
      const size_t close = tmpl.find("#}", tag + 2);
      i = close == std::string_view::npos ? tmpl.size() : close + 2;
      continue;
    }
    const char closer = kind == '{' ? '}' : '%';
    size_t j = tag + 2;
    for (; j < tmpl.size(); ++j) {
      const char c = tmpl[j];
      if (c == closer && j + 1 < tmpl.size() && tmpl[j + 1] == '}') break;
      if (tmpl.compare(j, 9, "bos_token") == 0 && (j == 0 || !is_identifier_char(tmpl[j - 1])) &&
          (j + 9 == tmpl.size() || !is_identifier_char(tmpl[j + 9])))
        out.names_bos_token = true;
      if (c != '\'' && c != '"') continue;
      const size_t body = j + 1;
      for (++j; j < tmpl.size() && tmpl[j] != c; ++j)
        if (tmpl[j] == '\\') ++j;  // an escaped character, the quote included
      out.texts.push_back(python_string_body(tmpl.substr(body, std::min(j, tmpl.size()) - body)));
    }
    if (kind == '{' && !first_found) {
      first_found = true;
      std::string_view expression = tmpl.substr(tag + 2, std::min(j, tmpl.size()) - (tag + 2));
      while (!expression.empty() && (expression.front() == '-' || expression.front() == '+' ||
                                     std::isspace(static_cast<unsigned char>(expression.front()))))
        expression.remove_prefix(1);
      out.first_output = std::string(expression);
    }
    i = std::min(j + 2, tmpl.size());
  }
  return out;
}

// The default system turn of a Qwen2.5-style template: a literal "<|im_start|>system\n" + text +
// "<|im_end|>" in one piece of template text or one string. "" when there is none; a system turn
// whose body comes from an expression (messages[0].content) is none. `source` names the template.
std::string find_default_system(const TemplateLiterals& literals, const std::string& source) {
  constexpr std::string_view marker = "<|im_start|>system\n";
  std::string found;
  for (const std::string& text : literals.texts)
    for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
      const size_t begin = at + marker.size();
      const size_t end = text.find("<|im_end|>", begin);
      if (end == std::string::npos) continue;
      const std::string body = text.substr(begin, end - begin);
      // Two different defaults (say, one for a branch with tools) cannot be told apart here.
      if (!found.empty() && body != found)
        fail("chat template of ", source, " writes two different default system turns (\"", found, "\" and \"", body,
             "\"), which Ingot cannot choose between; ", kSupported);
      found = body;
    }
  return found;
}

// Llama 3.1's knowledge date: the K of a literal "Cutting Knowledge Date: K\n", whose turn goes on
// "Today Date: ". A template that builds the line otherwise is not the one llama3.1 renders.
std::string find_knowledge_date(const TemplateLiterals& literals, const std::string& source) {
  constexpr std::string_view marker = "Cutting Knowledge Date: ";
  const bool today = std::any_of(literals.texts.begin(), literals.texts.end(),
                                 [](const std::string& t) { return t.find("Today Date: ") != std::string::npos; });
  for (const std::string& text : literals.texts)
    if (const size_t at = text.find(marker); at != std::string::npos && today) {
      const size_t end = text.find('\n', at);
      if (end != std::string::npos && end > at + marker.size()) return text.substr(at + marker.size(), end - at - marker.size());
    }
  fail("chat template of ", source, ": a Llama 3.1-style template that does not write \"Cutting Knowledge Date: ...\\n\" "
       "and \"Today Date: \" as literals; ", kSupported);
}

// The date after "Today Date: ", as transformers renders it: where the template calls
// strftime_now('FORMAT') (Llama 3.2), today's local date in that format (transformers defines it with
// Python's datetime.now()); else the literal it sets date_string to (Llama 3.1 and 3.3: "26 Jul 2024").
// Read from the template's code, comments left out; two different formats or literals are refused,
// since which one renders depends on branches this does not follow.
std::string template_date_string(std::string_view tmpl, const std::string& source) {
  std::string code;  // tmpl without its {# #} comments
  for (size_t i = 0; i < tmpl.size();) {
    const size_t open = tmpl.find("{#", i);
    code += tmpl.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    if (open == std::string_view::npos) break;
    const size_t close = tmpl.find("#}", open + 2);
    i = close == std::string_view::npos ? tmpl.size() : close + 2;
  }
  auto skip_blanks = [&](size_t at) {
    while (at < code.size() && std::isspace(static_cast<unsigned char>(code[at]))) ++at;
    return at;
  };
  auto literal_at = [&](size_t at) -> std::optional<std::string> {  // a quoted literal after blanks
    at = skip_blanks(at);
    if (at >= code.size() || (code[at] != '"' && code[at] != '\'')) return std::nullopt;
    size_t end = at + 1;
    for (; end < code.size() && code[end] != code[at]; ++end)
      if (code[end] == '\\') ++end;
    if (end >= code.size()) return std::nullopt;
    return python_string_body(std::string_view(code).substr(at + 1, end - at - 1));
  };
  // What follows each whole-word `name` followed by `sign` (blanks between): the position after the sign.
  auto after = [&](std::string_view name, char sign) {
    std::vector<size_t> ends;
    for (size_t at = code.find(name); at != std::string::npos; at = code.find(name, at + 1)) {
      const size_t end = skip_blanks(at + name.size());
      if ((at > 0 && is_identifier_char(code[at - 1])) || end >= code.size() || code[end] != sign) continue;
      if (sign == '=' && end + 1 < code.size() && code[end + 1] == '=') continue;  // a comparison
      ends.push_back(end + 1);
    }
    return ends;
  };
  // One value for every place, or an error: `what` names them for the message.
  auto only = [&](const std::vector<std::optional<std::string>>& values, const char* what) {
    for (const auto& v : values)
      if (v != values.front())
        fail("chat template of ", source, ": ", what, " differ (", v ? "\"" + *v + "\"" : std::string("an expression"),
             " and ", values.front() ? "\"" + *values.front() + "\"" : std::string("an expression"),
             "), and Ingot cannot tell which one renders; ", kSupported);
    return values.front();
  };
  if (const std::vector<size_t> calls = after("strftime_now", '('); !calls.empty()) {
    std::vector<std::optional<std::string>> patterns;
    for (const size_t at : calls) patterns.push_back(literal_at(at));
    const std::optional<std::string> pattern = only(patterns, "its strftime_now formats");
    // A date's fields only: Python writes %f, %z and %Z itself, and a time of day would differ
    // between the documents of one dataset.
    constexpr std::string_view fields = "aAbBdeYym%";
    bool plain = pattern.has_value();
    for (size_t k = 0; plain && k < pattern->size(); ++k)
      if ((*pattern)[k] == '%') plain = ++k < pattern->size() && fields.find((*pattern)[k]) != std::string_view::npos;
    if (!plain)
      fail("chat template of ", source, ": strftime_now takes a literal date format of %a %A %b %B %d %e %Y %y %m "
           "here, got ", pattern ? "\"" + *pattern + "\"" : std::string("an expression"), "; ", kSupported);
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char date[256];
    const size_t n = std::strftime(date, sizeof date, pattern->c_str(), &local);
    if (n == 0 && !pattern->empty())
      fail("chat template of ", source, ": strftime_now(\"", *pattern, "\") writes more than 255 bytes");
    return std::string(date, n);
  }
  std::vector<std::optional<std::string>> literals;
  for (const size_t at : after("date_string", '='))
    if (std::optional<std::string> literal = literal_at(at)) literals.push_back(std::move(literal));
  if (literals.empty())
    fail("chat template of ", source, ": a Llama 3.1-style template whose \"Today Date: \" is neither strftime_now('...') "
         "nor a literal date_string; ", kSupported);
  return *only(literals, "the literals it sets date_string to");
}

// Builds the rendered text and its trained spans piece by piece.
struct Renderer {
  RenderedChat out;
  void text(std::string_view s) { out.text += s; }
  void trained(std::string_view s) {
    if (s.empty()) return;
    const size_t begin = out.text.size();
    out.text += s;
    if (!out.trained.empty() && out.trained.back().second == begin)
      out.trained.back().second = out.text.size();
    else
      out.trained.emplace_back(begin, out.text.size());
  }
};

void render_llama3(const ChatFormat& f, std::span<const ChatMessage> messages, Renderer& r) {
  r.text(f.bos_token);
  if (f.dated()) {  // llama3.1: the dated system turn, holding the first system message
    r.text("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: ");
    r.text(f.knowledge_date);
    r.text("\nToday Date: ");
    r.text(f.date_string);
    r.text("\n\n");
    if (!messages.empty() && messages[0].role == "system") {
      r.text(python_strip(messages[0].content));
      messages = messages.subspan(1);
    }
    r.text("<|eot_id|>");
  }
  for (const ChatMessage& m : messages) {
    r.text("<|start_header_id|>");
    r.text(m.role);
    r.text("<|end_header_id|>\n\n");
    const std::string_view content = python_strip(m.content);
    if (m.role == "assistant") {
      r.trained(content);
      r.trained("<|eot_id|>");
    } else {
      r.text(content);
      r.text("<|eot_id|>");
    }
  }
}

bool is_tool_response(std::string_view s) {
  return s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
}

void render_chatml(const ChatFormat& f, std::span<const ChatMessage> messages, Renderer& r) {
  r.text(f.bos_token);
  const size_t n = messages.size();
  size_t first = 0;
  if (n > 0 && messages[0].role == "system") {
    r.text("<|im_start|>system\n");
    r.text(messages[0].content);
    r.text("<|im_end|>\n");
    first = 1;
  } else if (!f.default_system.empty()) {
    r.text("<|im_start|>system\n");
    r.text(f.default_system);
    r.text("<|im_end|>\n");
  }
  // Qwen3: the last user turn that is not a wrapped tool response; n - 1 when there is none.
  size_t last_query = n ? n - 1 : 0;
  for (size_t i = n; i-- > 0;)
    if (messages[i].role == "user" && !is_tool_response(messages[i].content)) {
      last_query = i;
      break;
    }
  for (size_t i = first; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "assistant") {
      r.text("<|im_start|>");
      r.text(m.role);
      r.text("\n");
      r.text(m.content);
      r.text("<|im_end|>\n");
      continue;
    }
    r.text("<|im_start|>assistant\n");
    if (!f.think_blocks) {
      r.trained(m.content);
    } else {
      std::string_view content = m.content, reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (const size_t close = content.find("</think>"); close != std::string_view::npos) {
        // reasoning: before the first </think>, after the last <think> there; answer: after the
        // last </think>.
        std::string_view before = rstrip_newlines(content.substr(0, close));
        if (const size_t open = before.rfind("<think>"); open != std::string_view::npos)
          before = before.substr(open + 7);
        reasoning = lstrip_newlines(before);
        content = lstrip_newlines(content.substr(content.rfind("</think>") + 8));
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        r.trained("<think>\n");
        r.trained(lstrip_newlines(rstrip_newlines(reasoning)));
        r.trained("\n</think>\n\n");
        r.trained(lstrip_newlines(content));
      } else {
        r.trained(content);
      }
    }
    r.trained("<|im_end|>");
    r.text("\n");
  }
}

// GPT-2's byte-level alphabet: code point -> byte (-1 for code points outside it).
const std::array<int16_t, 324>& byte_level_decoder() {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      t[printable ? b : next++] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

void append_token_bytes(const BpeTokenizer& tokenizer, int32_t id, std::string* out) {
  // An added token stands for its text, whatever bytes its characters would name in the byte-level
  // table: a non-special "héllo" was spelled h, 0xE9, l, l, o and failed the alignment.
  if (const std::string* text = tokenizer.added_token_text(id)) {
    *out += *text;
    return;
  }
  const std::string& s = tokenizer.id_to_token(id);
  const auto& decoder = byte_level_decoder();
  const size_t mark = out->size();
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t c = utf8_next(s, &pos);
    // A character outside the table: the token stands for its own text, as the decoder has it.
    if (c >= decoder.size() || decoder[c] < 0) {
      out->resize(mark);
      *out += s;
      return;
    }
    out->push_back(static_cast<char>(decoder[c]));
  }
}

// A JSON value's type with its article, for "X is an array, not a string".
std::string json_type(const nlohmann::json& j) {
  if (j.is_null()) return "null";
  const std::string name = j.type_name();
  return (name == "array" || name == "object" ? "an " : "a ") + name;
}

// The bos_token a template writes before each conversation, "" when it writes none. Llama 3: where
// it names bos_token (Meta's template adds it to the first message's text) or writes its text
// ("<|begin_of_text|>"). ChatML: where the first thing it writes is bos_token or its text (Hermes 3's
// "{{ bos_token }}"); ChatML bos text elsewhere (an eos written after each turn that the tokenizer
// config also names bos) is no bos. A bos_token that is one of the format's control tokens is
// never looked for as text. A named bos_token renders as nothing when the config has none, as in
// transformers.
std::string template_bos_token(const TemplateLiterals& literals, const std::string& bos_token, ChatFormatKind kind,
                               const std::vector<std::string>& control_tokens) {
  if (bos_token.empty()) return "";
  const bool control = std::find(control_tokens.begin(), control_tokens.end(), bos_token) != control_tokens.end();
  if (kind == ChatFormatKind::llama3) {
    if (literals.names_bos_token) return bos_token;
    for (const std::string& text : literals.texts)
      if (!control && text.find(bos_token) != std::string::npos) return bos_token;
    return "";
  }
  const std::string& first = literals.first_output;
  const bool names_first = first.starts_with("bos_token") &&
                           (first.size() == 9 || !(std::isalnum(static_cast<unsigned char>(first[9])) || first[9] == '_'));
  const bool writes_first = !control && (first.starts_with(bos_token) ||
                                         ((first.starts_with('\'') || first.starts_with('"')) &&
                                          python_string_body(first.substr(1)).starts_with(bos_token)));
  return names_first || writes_first ? bos_token : "";
}

// tokenizer_config.json's bos_token: a string, an object with a string "content", or "" for null.
std::string config_bos_token(const nlohmann::json& config, const std::string& file) {
  const auto b = config.find("bos_token");
  if (b == config.end() || b->is_null()) return "";
  if (b->is_string()) return b->get<std::string>();
  if (b->is_object() && b->contains("content") && (*b)["content"].is_string()) return (*b)["content"].get<std::string>();
  fail("chat format: ", file, ": bos_token must be a string or an object with a string \"content\", got ", io::json_brief(*b));
}

}  // namespace

std::string ChatFormat::name() const {
  if (kind == ChatFormatKind::llama3) return dated() ? "llama3.1" : "llama3";
  return think_blocks ? "chatml-qwen3" : "chatml";
}

std::string ChatFormat::end_of_turn() const { return kind == ChatFormatKind::llama3 ? "<|eot_id|>" : "<|im_end|>"; }

std::vector<std::string> ChatFormat::control_tokens() const {
  std::vector<std::string> tokens;
  if (kind == ChatFormatKind::llama3) tokens = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  else tokens = {"<|im_start|>", "<|im_end|>"};
  if (!bos_token.empty()) tokens.push_back(bos_token);
  return tokens;
}

ChatFormat chat_format_from_template(std::string_view tmpl, const std::string& bos_token,
                                     const std::string& source) {
  ChatFormat f;
  if (tmpl.find("<|start_header_id|>") != std::string_view::npos) {
    f.kind = ChatFormatKind::llama3;
    const TemplateLiterals literals = template_literals(tmpl);
    // Looked for in what the template writes: a comment that mentions it is no dated turn.
    if (std::any_of(literals.texts.begin(), literals.texts.end(),
                    [](const std::string& t) { return t.find("Cutting Knowledge Date") != std::string::npos; })) {
      f.knowledge_date = find_knowledge_date(literals, source);
      f.date_string = template_date_string(tmpl, source);
    }
    f.bos_token = template_bos_token(literals, bos_token, f.kind, f.control_tokens());
    return f;
  }
  if (tmpl.find("<|im_start|>") != std::string_view::npos) {
    f.kind = ChatFormatKind::chatml;
    f.think_blocks = tmpl.find("</think>") != std::string_view::npos;
    // Qwen3's think handling (reasoning_content, empty think blocks after the last query) is the one
    // built in; QwQ-style templates also mention </think> but drop the block from every turn.
    if (f.think_blocks && tmpl.find("reasoning_content") == std::string_view::npos)
      fail("chat template of ", source,
           ": a ChatML template with <think> handling other than Qwen3's (reasoning_content), such as "
           "QwQ's, is not supported; ",
           kSupported);
    const TemplateLiterals literals = template_literals(tmpl);
    f.default_system = find_default_system(literals, source);
    f.bos_token = template_bos_token(literals, bos_token, f.kind, f.control_tokens());
    return f;
  }
  fail("chat template of ", source, " is not a built-in chat format (", kSupported, ")");
}

namespace {
// A tokenizer config (a tokenizer_config.json, or a folder holding one), parsed.
struct TokenizerConfig {
  fs::path file;
  nlohmann::json json;
};
TokenizerConfig read_tokenizer_config(const std::string& path) {
  TokenizerConfig c{path, {}};
  if (fs::is_directory(c.file)) c.file /= "tokenizer_config.json";
  const std::string text = io::read_text_file(c.file.string(), "chat format: tokenizer config");
  io::check_json_nesting(text, c.file.string(), "chat format:");
  try {
    c.json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("chat format: ", c.file.string(), " is not valid JSON: ", io::json_error_text(e));
  }
  if (!c.json.is_object()) fail("chat format: ", c.file.string(), " is ", json_type(c.json), ", not a JSON object");
  return c;
}

// The chat_template.jinja the template is read from, as transformers reads a model folder: the one
// beside a tokenizer_config.json overrides its chat_template (transformers >= 4.49 saves it there);
// beside a config file of another name, which the user named, it serves only where that file has
// no chat_template. "" when the config's own template is read.
fs::path template_file_in_use(const TokenizerConfig& c) {
  const fs::path jinja = c.file.parent_path() / "chat_template.jinja";
  if (!optional_file_exists(jinja)) return {};
  const auto it = c.json.find("chat_template");
  const bool has_own = it != c.json.end() && !it->is_null();
  return c.file.filename() == "tokenizer_config.json" || !has_own ? jinja : fs::path();
}
}  // namespace

std::string chat_template_file_in_use(const std::string& path) {
  return template_file_in_use(read_tokenizer_config(path)).string();
}

namespace {
// Templates whose rendering by the built-in formats equals transformers' apply_chat_template, token
// for token, on the conversations of tools/check_chat_template.py (2026-12-02, jinja2 3.1.6,
// tokenizers 0.22.1): the repository's fixtures and public models' templates.
struct CheckedTemplate {
  uint64_t hash;
  const char* model;
};
constexpr CheckedTemplate kCheckedTemplates[] = {
    {0x76cb6c4659a68fe8, "tests/fixtures/chat/llama3_tokenizer"},
    {0x8e690c5d17e572ae, "tests/fixtures/chat/llama31"},
    {0xad16736ba07fbb39, "tests/fixtures/chat/chatml_tokenizer, chatml_default"},
    {0x2bfdb7aa9754484e, "Qwen3 (hybrid thinking: Qwen3-0.6B to 235B-A22B)"},
    {0x8a87094e0e1e24c5, "Qwen2-7B-Instruct"},
    {0xc867da37c989d41f, "Qwen1.5"},
    {0xe642ce246d7f2e3d, "Qwen2.5-Instruct"},
    {0x45ec583d4d25bc3a, "SmolLM2-Instruct"},
    {0x773d13e188afc917, "Mistral-7B-OpenOrca"},
    {0xe60067a5537498e, "Meta-Llama-3-8B-Instruct"},
    {0xcc0368e1ffb6b958, "Llama-3.1-8B-Instruct, Llama-3.3-70B-Instruct"},
    {0x368f4c34b8554414, "Llama-3.2-1B-Instruct, Llama-3.2-3B-Instruct"},
};
}  // namespace

void pin_chat_date(ChatFormat* format, const std::string& date, const std::string& command, const std::string& source) {
  if (!format->dated())
    fail(command, ": --chat-date-string is for templates that write a date (llama3.1); the chat template of ", source,
         " reads as ", format->name());
  if (date.find_first_of("\r\n") != std::string::npos)
    fail(command, ": --chat-date-string \"", date, "\" holds a line break");
  format->date_string = date;
}

std::string first_split_control_token(const ChatFormat& format, const BpeTokenizer& tokenizer) {
  for (const std::string& token : format.control_tokens())
    if (const std::vector<int32_t> ids = tokenizer.encode(token); ids.size() != 1 || tokenizer.token_to_id(token) != ids[0])
      return token;
  return "";
}

uint64_t chat_template_hash(std::string_view chat_template) {
  // Of the text as Jinja reads it: "\r\n" and "\r" are "\n", and one final newline is dropped, so
  // a template saved with other line ends is the same template.
  std::string text = jinja_newlines(chat_template);
  if (text.ends_with('\n')) text.pop_back();
  uint64_t hash = 0xcbf29ce484222325;
  for (const char c : text) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3;
  return hash;
}

ChatFormat load_chat_format(const std::string& path, const std::string& chat_format) {
  const TokenizerConfig c = read_tokenizer_config(path);
  std::string tmpl, source = c.file.string();
  const auto it = c.json.find("chat_template");
  if (const fs::path jinja = template_file_in_use(c); !jinja.empty()) {
    source = jinja.string();
    tmpl = io::read_text_file(source, "chat format: template");
    if (tmpl.empty()) fail("chat format: ", source, " is empty");
  } else if (it == c.json.end() || it->is_null()) {
    fail("chat format: ", source, " has no chat_template, and there is no chat_template.jinja beside it (", kSupported, ")");
  } else if (it->is_string()) {
    tmpl = it->get<std::string>();
    if (tmpl.empty()) fail("chat format: ", source, ": chat_template is empty (", kSupported, ")");
  } else if (it->is_array()) {  // named templates: [{"name": "default", "template": ...}, ...]
    const nlohmann::json* named = nullptr;
    for (const auto& t : *it)
      if (t.is_object() && t.contains("name") && t["name"] == "default") named = &t;
    if (named == nullptr)
      fail("chat format: ", source, ": chat_template is a list of named templates, none named \"default\" (", kSupported, ")");
    const auto text = named->find("template");
    if (text == named->end() || !text->is_string())
      fail("chat format: ", source, ": the chat_template named \"default\" is not a string (", kSupported, ")");
    tmpl = text->get<std::string>();
    if (tmpl.empty()) fail("chat format: ", source, ": the chat_template named \"default\" is empty (", kSupported, ")");
  } else {
    fail("chat format: ", source, ": chat_template is not a string (", kSupported, ")");
  }
  ChatFormat format = chat_format_from_template(tmpl, config_bos_token(c.json, c.file.string()), source);
  const uint64_t hash = chat_template_hash(tmpl);
  const bool checked = std::any_of(std::begin(kCheckedTemplates), std::end(kCheckedTemplates),
                                   [&](const CheckedTemplate& t) { return t.hash == hash; });
  format.checked = checked;
  if (!chat_format.empty() && chat_format != format.name())
    fail("chat format: --chat-format ", chat_format, ", but the chat template of ", source, " reads as ", format.name());
  if (!checked && chat_format.empty()) {
    char hex[24];
    std::snprintf(hex, sizeof hex, "0x%016llx", static_cast<unsigned long long>(hash));
    fail("chat format: the chat template of ", source, " (", hex, ") reads as ", format.name(),
         ", but it is not one whose rendering Ingot has checked against transformers': its own separators, "
         "trimming or default turns may differ from the built-in ", format.name(), " and train other text than "
         "the model sees. Check it with tools/check_chat_template.py --chat-format ", format.name(),
         " (a template whose every conversation matches can join kCheckedTemplates), or pass --chat-format ",
         format.name(), " to render it as ", format.name(), " anyway");
  }
  return format;
}

std::vector<ChatMessage> chat_messages_from_json(const nlohmann::json& messages) {
  if (!messages.is_array()) fail("\"messages\" is ", json_type(messages), ", not an array");
  if (messages.empty()) fail("\"messages\" is empty");
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& m = messages[i];
    if (!m.is_object()) fail("message ", i, " is ", json_type(m), ", not an object");
    const auto role = m.find("role");
    if (role == m.end()) fail("message ", i, " has no \"role\"");
    if (!role->is_string()) fail("message ", i, ": \"role\" is ", json_type(*role), ", not a string");
    const auto content = m.find("content");
    if (content == m.end()) fail("message ", i, " has no \"content\"");
    if (!content->is_string())
      fail("message ", i, ": \"content\" is ", json_type(*content), ", not a string",
           content->is_array() ? " (multimodal content lists are not supported)" : "");
    ChatMessage msg{role->get<std::string>(), content->get<std::string>(), std::nullopt};
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
      fail("message ", i, ": unknown role \"", msg.role, "\" (supported: system, user, assistant)");
    // Tool calls carry the answer outside "content": rendering the text alone trained an empty
    // answer without a word. (An empty list or null, as datasets write on every message, is none.)
    for (const char* calls : {"tool_calls", "function_call"})
      if (const auto c = m.find(calls); c != m.end() && !c->is_null() && !(c->is_array() && c->empty()))
        fail("message ", i, ": \"", calls, "\" is not supported (Ingot renders text turns only; the turn would "
             "train without its call)");
    if (const auto r = m.find("reasoning_content"); r != m.end() && !r->is_null()) {
      if (!r->is_string()) fail("message ", i, ": \"reasoning_content\" is not a string");
      msg.reasoning_content = r->get<std::string>();
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<ChatMessage> alpaca_messages_from_json(const nlohmann::json& record) {
  if (!record.is_object()) fail("record is ", json_type(record), ", not an object");
  auto string_field = [&](const char* name, bool required) -> std::string {
    const auto it = record.find(name);
    if (it == record.end() || it->is_null()) {
      if (required) fail("no \"", name, "\" field (alpaca records need instruction and output)");
      return "";
    }
    if (!it->is_string()) fail("\"", name, "\" is ", json_type(*it), ", not a string");
    return it->get<std::string>();
  };
  // Earlier turns (some alpaca sets carry them) would be left out without a word.
  if (const auto h = record.find("history"); h != record.end() && !h->is_null() && !(h->is_array() && h->empty()))
    fail("\"history\" (earlier turns) is not supported in alpaca records; convert them to --format chat messages");
  const std::string system = string_field("system", false);
  std::string user = string_field("instruction", true);
  const std::string input = string_field("input", false);
  const std::string output = string_field("output", true);
  if (!input.empty()) user += "\n\n" + input;
  std::vector<ChatMessage> out;
  if (!system.empty()) out.push_back({"system", system, std::nullopt});
  out.push_back({"user", std::move(user), std::nullopt});
  out.push_back({"assistant", output, std::nullopt});
  return out;
}

RenderedChat render_chat(const ChatFormat& format, std::span<const ChatMessage> messages) {
  Renderer r;
  if (format.kind == ChatFormatKind::llama3)
    render_llama3(format, messages, r);
  else
    render_chatml(format, messages, r);
  return std::move(r.out);
}

std::string render_generation_prompt(const ChatFormat& format, std::span<const ChatMessage> messages) {
  std::string text = render_chat(format, messages).text;
  text += format.kind == ChatFormatKind::llama3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n" : "<|im_start|>assistant\n";
  return text;
}

std::string token_bytes(const BpeTokenizer& tokenizer, int32_t id) {
  std::string out;
  append_token_bytes(tokenizer, id, &out);
  return out;
}

bool align_chat_mask(const RenderedChat& rendered, std::vector<int32_t> ids,
                     const BpeTokenizer& tokenizer, bool train_on_inputs, TokenizedChat* out) {
  std::string spelled;
  spelled.reserve(rendered.text.size());
  std::vector<size_t> ends(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    append_token_bytes(tokenizer, ids[i], &spelled);
    ends[i] = spelled.size();
  }
  if (spelled != rendered.text) return false;
  out->loss_mask.assign(ids.size(), train_on_inputs ? 1 : 0);
  if (!train_on_inputs) {
    size_t span = 0, begin = 0;
    for (size_t i = 0; i < ids.size(); begin = ends[i], ++i) {
      while (span < rendered.trained.size() && rendered.trained[span].second <= begin) ++span;
      if (span < rendered.trained.size() && rendered.trained[span].first < ends[i])
        out->loss_mask[i] = 1;  // token [begin, ends[i]) overlaps a trained span
    }
  }
  out->tokens = std::move(ids);
  return true;
}

TokenizedChat tokenize_chat(const ChatFormat& format, const BpeTokenizer& tokenizer,
                            std::span<const ChatMessage> messages, bool train_on_inputs) {
  TokenizedChat out;
  RenderedChat rendered = render_chat(format, messages);
  if (align_chat_mask(rendered, tokenizer.encode(rendered.text), tokenizer, train_on_inputs, &out))
    return out;
  // The normalizer changed the text: render NFC contents, as the tokenizer sees them.
  std::vector<ChatMessage> normalized(messages.begin(), messages.end());
  for (ChatMessage& m : normalized) {
    m.content = nfc_normalize(m.content);
    if (m.reasoning_content) m.reasoning_content = nfc_normalize(*m.reasoning_content);
  }
  rendered = render_chat(format, normalized);
  if (align_chat_mask(rendered, tokenizer.encode(rendered.text), tokenizer, train_on_inputs, &out))
    return out;
  // A byte the tokenizer has no token for (and no unk_token) is dropped, as tokenizers drops it.
  if (const int byte = tokenizer.first_dropped_byte(rendered.text); byte >= 0)
    fail("chat: the conversation holds byte ", byte_hex(static_cast<uint8_t>(byte)), ", which the tokenizer has no "
         "token for (and no unk_token): it drops it, so the tokens do not spell the text and the loss mask cannot be "
         "aligned");
  fail("chat: the tokens of a rendered conversation do not spell its text, so the loss mask cannot "
       "be aligned (a tokenizer normalizer other than NFC?)");
}

}  // namespace ingot::data
