// tokenizer.json byte-level BPE. Invariants:
//  - The pipeline works on raw UTF-8 bytes end to end: the GPT-2 byte<->char table is applied only
//    when loading the vocab (token strings -> byte strings) and never to the text being encoded.
//  - Shared state (vocab, merges, compiled regexes, tries) is read-only after load. Mutable scratch
//    (PCRE2 match data and JIT stack, the BPE cache) lives in per-thread ThreadState objects.
//  - Merge order equals `tokenizers`' Word::merge_all: the lowest rank first, the leftmost pair on
//    ties, each merge creating the two neighbouring pairs anew.
#include "ingot/data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <queue>
#include <sstream>
#include <utility>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <pcre2.h>

#include "ingot/core/broken_link.h"
#include "ingot/core/error.h"
#include "ingot/data/unicode_nfc.h"
#include "ingot/io/json_util.h"

namespace ingot::data {
namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to the
// code point of the same value; the other 68 bytes map, in byte order, to U+0100, U+0101, ...
std::array<char32_t, 256> byte_to_char_table() {
  std::array<char32_t, 256> table{};
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
  }
  return table;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// A pattern as errors quote it: a regex of a megabyte was echoed whole.
std::string brief_pattern(const std::string& pattern) {
  constexpr size_t kShown = 200;
  if (pattern.size() <= kShown) return pattern;
  size_t cut = kShown;
  while (cut > 0 && (static_cast<uint8_t>(pattern[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return pattern.substr(0, cut) + "... (" + std::to_string(pattern.size()) + " bytes)";
}

// `tokenizers` runs Oniguruma (Ruby syntax); Ingot runs PCRE2. Their shorthand classes differ, so
// each is spelled out as Oniguruma has it:
// - \s: U+0009..U+000D, U+0085 and General_Category Z* (PCRE2's also takes U+180E);
// - \w: Alphabetic, marks, decimal digits and connector punctuation, and in Latin-1 the digits
//   ² ³ ¹ ¼ ½ ¾ (PCRE2 10.42's is letters, numbers and '_': it split "e\u0301" and "a‿b");
// - \b, \B: boundaries of that \w;
// - \h: a hex digit (PCRE2's is horizontal space).
constexpr std::string_view kSpaceClassBody = "\\t-\\r\\x{85}\\p{Z}";
constexpr std::string_view kWordClassBody = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
constexpr std::string_view kHexClassBody = "0-9A-Fa-f";

// One character class of an Oniguruma pattern, from its '[' at pattern[i], spelled for PCRE2 into
// `out`; returns the index past its ']'. A negated shorthand inside (\S, \W, \H) has no spelling as
// a member of a PCRE2 class, so such a class becomes lookarounds: [a\W] is (?:[a]|[^w]), and the
// common "letters only" [^\W\d_] is (?:(?![\d_])[w]). POSIX brackets ([:alpha:]) are members;
// another '[' inside is a nested class, which PCRE2 has not, and is refused.
size_t translate_class(const std::string& pattern, size_t i, const std::string& where, std::string* out) {
  const size_t n = pattern.size();
  size_t j = i + 1;
  const bool negated = j < n && pattern[j] == '^';
  if (negated) ++j;
  std::string members;                          // the positive members, as a PCRE2 class body
  std::vector<std::string_view> excluded;       // bodies of the negated shorthands
  for (bool first = true;; first = false) {
    if (j >= n) {  // unclosed: PCRE2 names the error on the pattern as written
      *out += pattern.substr(i);
      return n;
    }
    const char c = pattern[j];
    if (c == ']' && !first) break;
    if (c == '\\' && j + 1 < n) {
      const char e = pattern[j + 1];
      if (e == 's') members += kSpaceClassBody;
      else if (e == 'w') members += kWordClassBody;
      else if (e == 'h') members += kHexClassBody;
      else if (e == 'S') excluded.push_back(kSpaceClassBody);
      else if (e == 'W') excluded.push_back(kWordClassBody);
      else if (e == 'H') excluded.push_back(kHexClassBody);
      else members += pattern.substr(j, 2);  // \d, \p{..}, \x{..}, \b (backspace here), escapes
      j += 2;
      continue;
    }
    if (c == '[') {
      const size_t close = pattern.compare(j, 2, "[:") == 0 ? pattern.find(":]", j + 2) : std::string::npos;
      if (close == std::string::npos)
        fail(where, ": regex \"", brief_pattern(pattern), "\" nests a character class inside another (at offset ", j,
             "), which Ingot cannot translate for PCRE2");
      members += pattern.substr(j, close + 2 - j);
      j = close + 2;
      continue;
    }
    members += c;
    ++j;
  }
  if (excluded.empty()) {
    *out += (negated ? "[^" : "[") + members + "]";
  } else if (!negated) {
    *out += "(?:";
    if (!members.empty()) *out += "[" + members + "]|";
    for (size_t k = 0; k < excluded.size(); ++k) {
      *out += k ? "|[^" : "[^";
      *out += excluded[k];
      *out += ']';
    }
    *out += ")";
  } else {  // none of the members, and inside every excluded shorthand's set
    *out += "(?:";
    if (!members.empty()) *out += "(?![" + members + "])";
    for (size_t k = 0; k + 1 < excluded.size(); ++k) {
      *out += "(?=[";
      *out += excluded[k];
      *out += "])";
    }
    *out += '[';
    *out += excluded.back();
    *out += "])";
  }
  return j + 1;
}

// The option letters of a group "(?imx-imx)" or "(?imx-imx:" starting at pattern[i], in PCRE2's
// spelling, with `*end` set to the index of its ')' or ':'; nullopt when the '(' opens another kind
// of group. Oniguruma's m is PCRE2's s (dot matches newline; ^ and $ are always per line). Its other
// options (W, D, S, P, y{g}) are refused by name, as is s, which Oniguruma has not.
std::optional<std::string> option_group_flags(const std::string& pattern, size_t i, const std::string& where,
                                              size_t* end) {
  if (pattern.compare(i, 2, "(?") != 0) return std::nullopt;
  size_t j = i + 2;
  while (j < pattern.size() && (std::isalpha(static_cast<unsigned char>(pattern[j])) || pattern[j] == '-')) ++j;
  if (j == i + 2 || j >= pattern.size() || (pattern[j] != ')' && pattern[j] != ':' && pattern[j] != '{'))
    return std::nullopt;
  std::string flags;
  for (size_t k = i + 2; k < j; ++k) {
    const char f = pattern[k];
    if (f == 'i' || f == 'x' || f == '-') flags += f;
    else if (f == 'm') flags += 's';
    else
      fail(where, ": regex \"", brief_pattern(pattern), "\" sets the group option '", f, "' (at offset ", k,
           "); Ingot translates only i, m and x for PCRE2", f == 's' ? " (Oniguruma has no s: its m is dot-all)" : "");
  }
  if (pattern[j] == '{') return std::nullopt;  // not an option group: PCRE2 names the error
  *end = j;
  return flags;
}

// An Oniguruma pattern as PCRE2 reads it the same way; `where` names it in errors.
std::string onig_to_pcre2(const std::string& pattern, const std::string& where) {
  const std::string word = "[" + std::string(kWordClassBody) + "]";
  auto set = [](std::string_view body, bool negated) { return (negated ? "[^" : "[") + std::string(body) + "]"; };
  std::string out;
  // An option set alone, "(?i)", reaches to the end of its enclosing group in Oniguruma, across '|':
  // a(?i)b|c is a(?i:b|c), where PCRE2 would read (?:a(?i)b)|(?i:c). It becomes "(?i:", closed where
  // its group closes; closers_at_depth counts them per open group (the whole pattern at depth 0).
  std::vector<int> closers_at_depth = {0};
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    if (c == '[') {
      i = translate_class(pattern, i, where, &out);
      continue;
    }
    if (c == '(') {
      size_t end = 0;
      if (pattern.compare(i, 3, "(?#") == 0) {
        // A comment ends at its first ')' that is not escaped; PCRE2's at its first ')'. Its text
        // does nothing, so an empty one takes its place.
        end = i + 3;
        while (end < pattern.size() && pattern[end] != ')') end += pattern[end] == '\\' ? 2 : 1;
        out += end < pattern.size() ? "(?#)" : pattern.substr(i);  // unclosed: PCRE2 names the error
        i = std::min(end + 1, pattern.size());
      } else if (const auto flags = option_group_flags(pattern, i, where, &end)) {
        out += "(?" + *flags + ":";
        if (pattern[end] == ')') ++closers_at_depth.back();
        else closers_at_depth.push_back(0);
        i = end + 1;
      } else {
        out += c;
        closers_at_depth.push_back(0);
        ++i;
      }
      continue;
    }
    if (c == ')') {
      out.append(closers_at_depth.back(), ')');
      if (closers_at_depth.size() > 1) closers_at_depth.pop_back();
      else closers_at_depth.back() = 0;  // unbalanced: PCRE2 names the error
      out += c;
      ++i;
      continue;
    }
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's' || e == 'S') out += set(kSpaceClassBody, e == 'S');
      else if (e == 'w' || e == 'W') out += set(kWordClassBody, e == 'W');
      else if (e == 'h' || e == 'H') out += set(kHexClassBody, e == 'H');
      else if (e == 'b') out += "(?:(?<=" + word + ")(?!" + word + ")|(?<!" + word + ")(?=" + word + "))";
      else if (e == 'B') out += "(?:(?<=" + word + ")(?=" + word + ")|(?<!" + word + ")(?!" + word + "))";
      else out += pattern.substr(i, 2);
      i += 2;
      continue;
    }
    out += c;
    ++i;
  }
  for (int closers : closers_at_depth) out.append(closers, ')');
  return out;
}

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct Regex {
  pcre2_code* code = nullptr;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { if (code) pcre2_code_free(code); }
};

std::unique_ptr<Regex> compile_regex(const std::string& pattern, bool literal, const std::string& where) {
  auto regex = std::make_unique<Regex>();
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const std::string translated = literal ? pattern : onig_to_pcre2(pattern, where);
  // Ruby syntax anchors ^ and $ at every line (after and before "\n" alone), as PCRE2's multiline
  // mode with LF newlines does.
  const uint32_t options = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE);
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              options, &error_code, &error_offset, context);
  pcre2_compile_context_free(context);
  if (!regex->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    // The offset is into the translated pattern where a shorthand class was spelled out.
    fail(where, ": cannot compile regex \"", brief_pattern(pattern), "\"", translated == pattern ? " at offset " : "",
         translated == pattern ? std::to_string(error_offset) : std::string(), ": ",
         reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  return regex;
}

enum class SplitBehavior { isolated, removed };

// One pre-tokenizer step: a regex split, or ByteLevel (optional prefix space, optional GPT-2 split).
struct PreTokenizerStep {
  bool byte_level = false;
  bool add_prefix_space = false;  // ByteLevel only
  const Regex* regex = nullptr;   // null: no split
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Byte trie over added-token contents, for leftmost-longest matching.
struct Trie {
  struct Node {
    int32_t token = -1;  // index into added_tokens
    std::vector<std::pair<uint8_t, int32_t>> children;
  };
  std::vector<Node> nodes{Node{}};
  std::array<bool, 256> first_byte{};

  void insert(std::string_view key, int32_t token) {
    if (key.empty()) return;
    first_byte[static_cast<uint8_t>(key[0])] = true;
    int32_t n = 0;
    for (char ch : key) {
      const uint8_t b = static_cast<uint8_t>(ch);
      int32_t next = -1;
      for (auto& [k, v] : nodes[n].children)
        if (k == b) { next = v; break; }
      if (next < 0) {
        next = static_cast<int32_t>(nodes.size());
        nodes[n].children.emplace_back(b, next);
        nodes.emplace_back();
      }
      n = next;
    }
    if (nodes[n].token < 0) nodes[n].token = token;
  }
  bool empty() const { return nodes.size() == 1; }
  // Longest token starting at text[pos]: returns its index and sets *length, or -1.
  int32_t longest(std::string_view text, size_t pos, size_t* length) const {
    int32_t n = 0, found = -1;
    for (size_t i = pos; i < text.size(); ++i) {
      const uint8_t b = static_cast<uint8_t>(text[i]);
      int32_t next = -1;
      for (const auto& [k, v] : nodes[n].children)
        if (k == b) { next = v; break; }
      if (next < 0) break;
      n = next;
      if (nodes[n].token >= 0) { found = nodes[n].token; *length = i + 1 - pos; }
    }
    return found;
  }
};

struct ThreadState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* match_context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> symbols;
  ThreadState() {
    match_data = pcre2_match_data_create(1, nullptr);
    match_context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(match_context, nullptr, jit_stack);
  }
  ~ThreadState() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(match_context);
    pcre2_jit_stack_free(jit_stack);
  }
};

// Open-addressing hash map from a merge pair (left << 32 | right) to (rank << 32 | merged id):
// one probe sequence in a flat array, which beats std::unordered_map's node chasing in the BPE loop.
class MergeTable {
 public:
  static constexpr uint64_t kNone = ~uint64_t(0);
  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    slots_.assign(capacity, Slot{kNone, kNone});
    mask_ = capacity - 1;
  }
  // A repeated key takes the later value, as `tokenizers`' HashMap collect does.
  void insert(uint64_t key, uint64_t value) {
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) { slots_[i].value = value; return; }
      if (slots_[i].key == kNone) { slots_[i] = Slot{key, value}; return; }
    }
  }
  uint64_t find(uint64_t key) const {
    for (size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].value;
      if (slots_[i].key == kNone) return kNone;
    }
  }

 private:
  struct Slot { uint64_t key, value; };
  size_t hash(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask_; }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

constexpr size_t kCacheMaxEntries = 1 << 16;
constexpr size_t kCacheMaxKeyBytes = 64;
std::atomic<uint64_t> next_instance_id{1};

}  // namespace

struct BpeTokenizerImpl {
  std::string path;
  uint64_t instance_id = next_instance_id++;
  int64_t vocab_size = 0;
  int32_t eos_id = -1;
  std::vector<std::string> id_to_token;  // tokenizer.json strings; empty for unused ids
  std::vector<std::string> id_to_bytes;  // what each id decodes to
  std::vector<uint8_t> id_is_special;
  StringMap token_to_id;                 // vocab and added tokens, tokenizer.json strings
  StringMap bytes_to_id;                 // vocab, by raw bytes (ignore_merges)
  std::array<int32_t, 256> byte_id{};    // id of each single byte, -1 if absent
  MergeTable merges;                     // (left << 32 | right) -> (rank << 32 | merged)
  bool ignore_merges = false;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool nfc = false;
  std::vector<std::unique_ptr<Regex>> regexes;
  std::vector<PreTokenizerStep> steps;
  std::vector<AddedToken> added_tokens;
  std::unordered_map<int32_t, std::string> added_token_text;  // id -> text as matched
  Trie raw_trie, normalized_trie;  // added tokens with normalized=false / true
  bool encode_special_tokens = false;
  std::unique_ptr<Regex> word_char;  // Rust's char::is_alphanumeric || '_' (single_word)
  // The post-processor's special tokens around a single text (TemplateProcessing's "single"), or the
  // type of a post-processor Ingot does not read (special_prefix() then refuses).
  std::vector<int32_t> special_prefix, special_suffix;
  std::string unsupported_post_processor;

  ThreadState& thread_state() const {
    thread_local std::unordered_map<uint64_t, std::unique_ptr<ThreadState>> states;
    auto it = states.find(instance_id);
    if (it != states.end()) return *it->second;
    if (states.size() >= 8) states.clear();  // tokenizers that are gone; rare
    return *states.emplace(instance_id, std::make_unique<ThreadState>()).first->second;
  }

  void encode(std::string_view text, std::vector<int32_t>* out) const;
  void encode_segment(std::string_view segment, ThreadState& ts, std::vector<int32_t>* out) const;
  void split_added(std::string_view text, const Trie& trie, std::vector<std::pair<int32_t, std::string_view>>* parts) const;
  void pre_tokenize(std::string_view piece, size_t step, ThreadState& ts, std::vector<int32_t>* out) const;
  void bpe(std::string_view piece, ThreadState& ts, std::vector<int32_t>* out) const;
  void merge_symbols(std::vector<int32_t>& symbols) const;
  bool is_word_char_before(std::string_view text, size_t end) const;
  bool is_word_char_at(std::string_view text, size_t pos) const;
};

namespace {

std::string json_type(const json& node) {
  if (node.is_object() && node.contains("type") && node["type"].is_string())
    return node["type"].get<std::string>();
  return io::json_brief(node);
}

void load_normalizer(BpeTokenizerImpl& t, const json& node) {
  if (node.is_null()) return;
  const std::string type = json_type(node);
  if (type == "NFC") { t.nfc = true; return; }
  if (type == "Sequence") {
    for (const auto& child : node.value("normalizers", json::array())) load_normalizer(t, child);
    return;
  }
  fail(t.path, ": unsupported normalizer \"", type, "\" (supported: none, NFC)");
}

void load_pre_tokenizer(BpeTokenizerImpl& t, const json& node) {
  const std::string type = json_type(node);
  if (type == "Sequence") {
    for (const auto& child : node.value("pretokenizers", json::array())) load_pre_tokenizer(t, child);
    return;
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    step.add_prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) {
      t.regexes.push_back(compile_regex(kGpt2Pattern, false, t.path + ": ByteLevel pre-tokenizer"));
      step.regex = t.regexes.back().get();
    }
  } else if (type == "Split") {
    const json& pattern = node.at("pattern");
    const std::string where = t.path + ": Split pre-tokenizer";
    if (pattern.contains("Regex")) {
      t.regexes.push_back(compile_regex(pattern["Regex"].get<std::string>(), false, where));
    } else if (pattern.contains("String")) {
      // `tokenizers` escapes it into a regex: "" matches between every two characters, and splits there.
      t.regexes.push_back(compile_regex(pattern["String"].get<std::string>(), true, where));
    } else {
      fail(where, ": unsupported pattern ", pattern.dump());
    }
    step.regex = t.regexes.back().get();
    const std::string behavior = node.value("behavior", std::string("Isolated"));
    if (behavior == "Isolated") step.behavior = SplitBehavior::isolated;
    else if (behavior == "Removed") step.behavior = SplitBehavior::removed;
    else fail(where, ": unsupported behavior \"", behavior, "\" (supported: Isolated, Removed)");
    step.invert = node.value("invert", false);
  } else {
    fail(t.path, ": unsupported pre_tokenizer \"", type, "\" (supported: ByteLevel, Split, Sequence)");
  }
  t.steps.push_back(step);
}

void check_decoder(const BpeTokenizerImpl& t, const json& node) {
  const std::string type = json_type(node);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& children = node.value("decoders", json::array());
    if (!children.empty()) {
      for (const auto& child : children) check_decoder(t, child);
      return;
    }
  }
  fail(t.path, ": unsupported decoder \"", type, "\" (supported: ByteLevel)");
}

// post_processor: ByteLevel only adjusts offsets; TemplateProcessing's "single" template puts
// special tokens around the text ($A); Sequence chains them. Needs the vocab and added tokens.
void load_post_processor(BpeTokenizerImpl& t, const json& node) {
  if (node.is_null()) return;
  const std::string type = json_type(node);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& child : node.value("processors", json::array())) load_post_processor(t, child);
    return;
  }
  if (type != "TemplateProcessing") {
    t.unsupported_post_processor = type;
    return;
  }
  // "special_tokens" maps a name to its ids; without an entry, the name is the token.
  const json specials = node.value("special_tokens", json::object());
  bool after_text = false;
  for (const json& piece : node.at("single")) {
    if (piece.contains("Sequence")) {
      after_text = true;
      continue;
    }
    const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
    std::vector<int32_t> ids;
    if (specials.contains(name)) {
      for (const json& id : specials[name].at("ids")) {
        // Read wide, so that an id beyond int32 is named below rather than wrapped into the vocabulary.
        if (!id.is_number_integer())
          fail(t.path, ": post_processor's special token \"", name, "\" has a non-integer id ", io::json_brief(id));
        const int64_t wide = id.get<int64_t>();
        if (wide < 0 || wide >= t.vocab_size)
          fail(t.path, ": post_processor's special token \"", name, "\" has id ", id.dump(), ", outside the vocabulary of ",
               t.vocab_size);
        ids.push_back(static_cast<int32_t>(wide));
      }
    } else if (auto it = t.token_to_id.find(name); it != t.token_to_id.end()) {
      ids.push_back(it->second);
    }
    if (ids.empty()) fail(t.path, ": post_processor's special token \"", name, "\" has no id");
    for (const int32_t id : ids)
      if (id < 0 || id >= t.vocab_size)
        fail(t.path, ": post_processor's special token \"", name, "\" has id ", id, ", outside the vocabulary of ", t.vocab_size);
    auto& side = after_text ? t.special_suffix : t.special_prefix;
    side.insert(side.end(), ids.begin(), ids.end());
  }
}

}  // namespace

BpeTokenizer BpeTokenizer::from_file(const std::string& path_in) {
  namespace fs = std::filesystem;
  fs::path path(path_in);
  if (fs::is_directory(path)) path /= "tokenizer.json";
  auto t = std::make_unique<BpeTokenizerImpl>();
  t->path = path.string();
  json root;
  try {
    const std::string text = io::read_text_file(t->path, "tokenizer");
    io::check_json_nesting(text, t->path, "tokenizer");
    root = json::parse(text);
  } catch (const json::exception& e) {
    fail(t->path, ": not valid JSON: ", io::json_error_text(e));
  }
  if (!root.is_object()) fail(t->path, ": a tokenizer.json must be a JSON object, got ", root.type_name());
  if (!root.contains("model") || !root["model"].is_object())
    fail(t->path, ": key \"model\" (the tokenizer's vocab and merges) must be an object");
  const char* reading = "model";  // the part being read, for a JSON type error's message
  try {
    const json& model = root.at("model");
    const std::string model_type = model.value("type", std::string(model.contains("merges") ? "BPE" : "?"));
    if (model_type != "BPE")
      fail(t->path, ": unsupported model type \"", model_type, "\" (supported: BPE)");
    if (model.value("byte_fallback", false))
      fail(t->path, ": unsupported BPE option byte_fallback=true (supported: byte-level BPE)");
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
      fail(t->path, ": unsupported BPE option dropout=", model["dropout"].dump());
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
        fail(t->path, ": unsupported BPE option ", key, "=", model[key].dump());
    t->ignore_merges = model.value("ignore_merges", false);
    t->fuse_unk = model.value("fuse_unk", false);
    if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
      fail(t->path, ": unsupported pre_tokenizer null (a byte-level pre-tokenizer is required)");
    reading = "normalizer";
    load_normalizer(*t, root.value("normalizer", json()));
    reading = "pre_tokenizer";
    load_pre_tokenizer(*t, root["pre_tokenizer"]);
    // Each step is a level of recursion when encoding: 20000 of them overflowed the stack.
    constexpr size_t kMaxPreTokenizerSteps = 64;
    if (t->steps.size() > kMaxPreTokenizerSteps)
      fail(t->path, ": unsupported pre_tokenizer: ", t->steps.size(), " steps, where Ingot takes at most ",
           kMaxPreTokenizerSteps, " (real tokenizers have two or three)");
    if (t->steps.empty() || !t->steps.back().byte_level)
      fail(t->path, ": unsupported pre_tokenizer ", root["pre_tokenizer"].dump().substr(0, 200),
           " (the last step must be ByteLevel)");
    for (size_t i = 0; i + 1 < t->steps.size(); ++i)
      if (t->steps[i].byte_level)
        fail(t->path, ": unsupported pre_tokenizer: ByteLevel must be the last step");
    if (!root.contains("decoder") || root["decoder"].is_null())
      fail(t->path, ": unsupported decoder null (supported: ByteLevel)");
    reading = "decoder";
    check_decoder(*t, root["decoder"]);

    // Vocab.
    const auto table = byte_to_char_table();
    std::unordered_map<char32_t, uint8_t> char_to_byte;
    for (int b = 0; b < 256; ++b) char_to_byte[table[b]] = static_cast<uint8_t>(b);
    auto token_bytes = [&](const std::string& token) {
      // `tokenizers`' ByteLevel decoder: a token whose chars all come from the byte table decodes
      // to those bytes; any other token decodes to its own UTF-8.
      std::string bytes;
      for (size_t pos = 0; pos < token.size();) {
        auto it = char_to_byte.find(utf8_next(token, &pos));
        if (it == char_to_byte.end()) return std::make_pair(token, false);
        bytes.push_back(static_cast<char>(it->second));
      }
      return std::make_pair(bytes, true);
    };
    reading = "model.vocab";
    const json& vocab = model.at("vocab");
    if (!vocab.is_object()) fail(t->path, ": model.vocab must be an object of token -> id, got ", vocab.type_name());
    // Ids index tables of vocab_size entries: a negative or absurd id (real vocabularies stay
    // below a million) is an error here, not a crash or a giant allocation later.
    constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;
    auto checked_id = [&](const json& id_json, const char* where, const std::string& token) {
      if (!id_json.is_number_integer())
        fail(t->path, ": ", where, " id of token \"", token, "\" must be an integer, got ", id_json.dump());
      // As written: an id past int64 read back as -1.
      if (id_json.is_number_unsigned() ? id_json.get<uint64_t>() > uint64_t(kMaxTokenId)
                                       : (id_json.get<int64_t>() < 0 || id_json.get<int64_t>() > kMaxTokenId))
        fail(t->path, ": ", where, " id ", id_json.dump(), " of token \"", token, "\" is outside [0, ", kMaxTokenId, "]");
      const int64_t id = id_json.get<int64_t>();
      return static_cast<int32_t>(id);
    };
    int64_t max_id = -1;
    for (const auto& [token, id] : vocab.items()) max_id = std::max<int64_t>(max_id, checked_id(id, "vocab", token));
    reading = "added_tokens";
    const json added = root.value("added_tokens", json::array());
    for (const auto& a : added)
      max_id = std::max<int64_t>(max_id, checked_id(a.at("id"), "added token", a.value("content", std::string())));
    t->vocab_size = max_id + 1;
    t->id_to_token.assign(t->vocab_size, std::string());
    t->id_to_bytes.assign(t->vocab_size, std::string());
    t->id_is_special.assign(t->vocab_size, 0);
    t->token_to_id.reserve(vocab.size() + added.size());
    reading = "model.vocab";
    std::vector<char> id_taken(size_t(t->vocab_size), 0);  // not id_to_token's emptiness: "" is a string too
    for (const auto& [token, id_json] : vocab.items()) {
      const int32_t id = id_json.get<int32_t>();
      if (std::exchange(id_taken[size_t(id)], 1))
        fail(t->path, ": vocab id ", id, " is given to both \"", t->id_to_token[id], "\" and \"", token, "\"");
      if (utf8_find_invalid(token) != std::string_view::npos)
        fail(t->path, ": vocab token with id ", id, " is not valid UTF-8");
      t->id_to_token[id] = token;
      t->token_to_id[token] = id;
      auto [bytes, mapped] = token_bytes(token);
      t->id_to_bytes[id] = bytes;
      if (mapped && !bytes.empty()) t->bytes_to_id.emplace(bytes, id);
    }
    t->byte_id.fill(-1);
    for (int b = 0; b < 256; ++b) {
      auto it = t->bytes_to_id.find(std::string(1, static_cast<char>(b)));
      if (it != t->bytes_to_id.end()) t->byte_id[b] = it->second;
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = t->token_to_id.find(model["unk_token"].get<std::string>());
      if (it != t->token_to_id.end()) t->unk_id = it->second;
    }

    // Merges: "left right" strings (older files) or [left, right] pairs.
    reading = "model.merges";
    const json& merges = model.at("merges");
    if (!merges.is_array()) fail(t->path, ": model.merges must be a list, got ", merges.type_name());
    t->merges.reserve(merges.size());
    uint32_t rank = 0;
    for (const auto& m : merges) {
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          fail(t->path, ": merge ", rank, " \"", s, "\" is not two tokens separated by one space");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        fail(t->path, ": merge ", rank, " is neither \"a b\" nor [a, b]: ", m.dump());
      }
      auto l = t->token_to_id.find(left), r = t->token_to_id.find(right),
           merged = t->token_to_id.find(left + right);
      if (l == t->token_to_id.end() || r == t->token_to_id.end() || merged == t->token_to_id.end())
        fail(t->path, ": merge ", rank, " (\"", left, "\", \"", right, "\") uses a token not in the vocab");
      const uint64_t key = (uint64_t(uint32_t(l->second)) << 32) | uint32_t(r->second);
      t->merges.insert(key, (uint64_t(rank) << 32) | uint32_t(merged->second));
      ++rank;
    }

    // Added tokens: they override vocab entries of the same id for decoding.
    reading = "added_tokens";
    for (const auto& a : added) {
      AddedToken token;
      token.content = a.at("content").get<std::string>();
      token.id = a.at("id").get<int32_t>();
      token.single_word = a.value("single_word", false);
      token.lstrip = a.value("lstrip", false);
      token.rstrip = a.value("rstrip", false);
      token.normalized = a.value("normalized", false);
      token.special = a.value("special", false);
      if (utf8_find_invalid(token.content) != std::string_view::npos)
        fail(t->path, ": added token with id ", token.id, " is not valid UTF-8");
      t->id_to_token[token.id] = token.content;
      t->id_to_bytes[token.id] = token_bytes(token.content).first;
      t->id_is_special[token.id] = token.special;
      t->token_to_id[token.content] = token.id;
      const int32_t index = static_cast<int32_t>(t->added_tokens.size());
      const std::string matched = token.normalized && t->nfc ? nfc_normalize(token.content) : token.content;
      if (token.normalized) t->normalized_trie.insert(matched, index);
      else t->raw_trie.insert(matched, index);
      t->added_token_text[token.id] = matched;
      t->added_tokens.push_back(std::move(token));
    }
    t->word_char = compile_regex("[\\p{Alphabetic}\\p{N}_]", false, t->path);
    reading = "post_processor";
    load_post_processor(*t, root.value("post_processor", json()));
  } catch (const json::exception& e) {
    fail(t->path, ": ", reading, " is not as a tokenizer.json has it: ", io::json_error_text(e));
  }

  // eos from tokenizer_config.json next to tokenizer.json.
  const fs::path config = path.parent_path() / "tokenizer_config.json";
  if (optional_file_exists(config)) {
    try {
      const std::string text = io::read_text_file(config.string(), "tokenizer config");
      io::check_json_nesting(text, config.string(), "tokenizer config");
      const json c = json::parse(text);
      if (!c.is_object()) fail(config.string(), ": a tokenizer config must be a JSON object, got ", io::json_brief(c));
      std::string eos;
      if (c.contains("eos_token") && c["eos_token"].is_string()) eos = c["eos_token"].get<std::string>();
      else if (c.contains("eos_token") && c["eos_token"].is_object()) {
        const json content = c["eos_token"].value("content", json(""));
        if (!content.is_string())
          fail(config.string(), ": eos_token's \"content\" must be a string, got ", io::json_brief(content));
        eos = content.get<std::string>();
      }
      if (!eos.empty()) {
        auto it = t->token_to_id.find(eos);
        if (it == t->token_to_id.end()) fail(config.string(), ": eos_token \"", eos, "\" is not a token");
        t->eos_id = it->second;
      }
    } catch (const json::exception& e) {
      fail(config.string(), ": not valid JSON: ", io::json_error_text(e));
    }
  }
  return BpeTokenizer(std::move(t));
}

bool BpeTokenizerImpl::is_word_char_at(std::string_view text, size_t pos) const {
  const int rc = pcre2_match(word_char->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                             PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, thread_state().match_data,
                             thread_state().match_context);
  return rc > 0;
}

bool BpeTokenizerImpl::is_word_char_before(std::string_view text, size_t end) const {
  if (end == 0) return false;
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return is_word_char_at(text, start);
}

// `tokenizers`' AddedVocabulary::find_matches: leftmost-longest matches; a skipped match (single
// word, or special with encode_special_tokens) still consumes its span from the search.
void BpeTokenizerImpl::split_added(std::string_view text, const Trie& trie,
                                   std::vector<std::pair<int32_t, std::string_view>>* parts) const {
  size_t start_offset = 0, pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    if (!trie.first_byte[static_cast<uint8_t>(text[pos])]) { ++pos; continue; }
    size_t length = 0;
    const int32_t index = trie.longest(text, pos, &length);
    if (index < 0) { ++pos; continue; }
    const AddedToken& token = added_tokens[index];
    size_t start = pos, stop = pos + length;
    pos = stop;
    if (token.special && encode_special_tokens) continue;
    if (token.single_word) {
      const bool start_space = start == 0 || !is_word_char_before(text, start);
      const bool stop_space = stop == n || !is_word_char_at(text, stop);
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t prev = s - 1;
        while (prev > 0 && (static_cast<uint8_t>(text[prev]) & 0xC0) == 0x80) --prev;
        size_t p = prev;
        if (!unicode_is_whitespace(utf8_next(text, &p))) break;
        s = prev;
      }
      start = std::max(s, start_offset);
    }
    if (token.rstrip) {
      size_t p = stop;
      while (p < n) {
        size_t q = p;
        if (!unicode_is_whitespace(utf8_next(text, &q))) break;
        p = q;
      }
      stop = p;
      pos = stop;
    }
    if (start_offset < start) parts->emplace_back(-1, text.substr(start_offset, start - start_offset));
    parts->emplace_back(token.id, text.substr(start, stop - start));
    start_offset = stop;
  }
  if (start_offset < n) parts->emplace_back(-1, text.substr(start_offset));
}

void BpeTokenizerImpl::encode(std::string_view text, std::vector<int32_t>* out) const {
  const size_t bad = utf8_find_invalid(text);
  if (bad != std::string_view::npos) fail("tokenizer: invalid UTF-8 at byte ", bad, " of the input text");
  ThreadState& ts = thread_state();
  if (raw_trie.empty()) {
    encode_segment(text, ts, out);
    return;
  }
  std::vector<std::pair<int32_t, std::string_view>> parts;
  split_added(text, raw_trie, &parts);
  for (const auto& [id, part] : parts) {
    if (id >= 0) out->push_back(id);
    else encode_segment(part, ts, out);
  }
}

void BpeTokenizerImpl::encode_segment(std::string_view segment, ThreadState& ts, std::vector<int32_t>* out) const {
  std::string normalized;
  std::string_view text = segment;
  if (nfc && !nfc_is_normalized(segment)) {
    normalized = nfc_normalize(segment);
    text = normalized;
  }
  if (normalized_trie.empty()) {
    pre_tokenize(text, 0, ts, out);
    return;
  }
  std::vector<std::pair<int32_t, std::string_view>> parts;
  split_added(text, normalized_trie, &parts);
  for (const auto& [id, part] : parts) {
    if (id >= 0) out->push_back(id);
    else pre_tokenize(part, 0, ts, out);
  }
}

void BpeTokenizerImpl::pre_tokenize(std::string_view piece, size_t step_index, ThreadState& ts,
                                    std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (step_index == steps.size()) {
    bpe(piece, ts, out);
    return;
  }
  const PreTokenizerStep& step = steps[step_index];
  std::string prefixed;
  if (step.add_prefix_space && piece[0] != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece);
    piece = prefixed;
  }
  if (!step.regex) {
    pre_tokenize(piece, step_index + 1, ts, out);
    return;
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  const size_t n = piece.size();
  const bool keep_matches = !(step.behavior == SplitBehavior::removed && !step.invert);
  const bool keep_gaps = !(step.behavior == SplitBehavior::removed && step.invert);
  // Matches as the `onig` crate's find_iter yields them to `tokenizers`: an empty match counts
  // (it cuts the text there: "(?=(\d{3})+(?!\d))" groups digits by threes), except one where the
  // previous match ended, which moves the search on by a character.
  size_t search_from = 0, prev = 0, last_match_end = SIZE_MAX;
  while (search_from <= n) {
    const int rc = pcre2_match(step.regex->code, subject, n, search_from, PCRE2_NO_UTF_CHECK, ts.match_data,
                               ts.match_context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail(path, ": pre-tokenizer regex failed: ", reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(ts.match_data);
    const size_t start = ovector[0], end = ovector[1];
    if (start == end && end == last_match_end) {
      ++search_from;
      while (search_from < n && (static_cast<uint8_t>(piece[search_from]) & 0xC0) == 0x80) ++search_from;
      continue;
    }
    search_from = last_match_end = end;
    if (start > prev && keep_gaps) pre_tokenize(piece.substr(prev, start - prev), step_index + 1, ts, out);
    if (keep_matches) pre_tokenize(piece.substr(start, end - start), step_index + 1, ts, out);
    prev = end;
  }
  if (prev < n && keep_gaps) pre_tokenize(piece.substr(prev), step_index + 1, ts, out);
}

void BpeTokenizerImpl::merge_symbols(std::vector<int32_t>& s) const {
  const size_t n = s.size();
  auto lookup = [&](int32_t a, int32_t b) -> uint64_t {
    return merges.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
  };
  if (n < 2) return;
  if (n <= 128) {
    // Short words: keep each adjacent pair's (rank, merged) and rescan for the minimum.
    std::vector<uint64_t> pair(n - 1);
    for (size_t i = 0; i + 1 < n; ++i) pair[i] = lookup(s[i], s[i + 1]);
    size_t count = n;
    while (count > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < count; ++i)
        if ((pair[i] >> 32) < (pair[best] >> 32)) best = i;
      if (pair[best] == ~uint64_t(0)) break;
      s[best] = static_cast<int32_t>(pair[best] & 0xFFFFFFFFu);
      s.erase(s.begin() + best + 1);
      pair.erase(pair.begin() + best);
      --count;
      if (best > 0) pair[best - 1] = lookup(s[best - 1], s[best]);
      if (best + 1 < count) pair[best] = lookup(s[best], s[best + 1]);
    }
    return;
  }
  // Long words: a heap of (rank, position) over a linked list; stale entries are skipped.
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  using Entry = std::pair<uint64_t, int32_t>;  // (rank << 32 | merged, left position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int32_t i) {
    if (i < 0 || next[i] < 0) return;
    const uint64_t m = lookup(s[i], s[next[i]]);
    if (m != ~uint64_t(0)) heap.emplace((m & 0xFFFFFFFF00000000ull) | uint32_t(i), i);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const auto [key, i] = heap.top();
    heap.pop();
    if (!alive[i] || next[i] < 0) continue;
    const uint64_t m = lookup(s[i], s[next[i]]);
    if (m == ~uint64_t(0) || (m >> 32) != (key >> 32)) continue;
    const int32_t j = next[i];
    s[i] = static_cast<int32_t>(m & 0xFFFFFFFFu);
    alive[j] = 0;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) s[w++] = s[i];
  s.resize(w);
}

void BpeTokenizerImpl::bpe(std::string_view piece, ThreadState& ts, std::vector<int32_t>* out) const {
  if (piece.size() == 1 && byte_id[static_cast<uint8_t>(piece[0])] >= 0) {
    out->push_back(byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (ignore_merges) {
    auto it = bytes_to_id.find(piece);
    if (it != bytes_to_id.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= kCacheMaxKeyBytes;
  if (cacheable) {
    auto it = ts.cache.find(piece);
    if (it != ts.cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t>& s = ts.symbols;
  s.clear();
  for (char ch : piece) {
    const int32_t id = byte_id[static_cast<uint8_t>(ch)];
    if (id >= 0) s.push_back(id);
    else if (unk_id >= 0 && !(fuse_unk && !s.empty() && s.back() == unk_id)) s.push_back(unk_id);
  }
  merge_symbols(s);
  out->insert(out->end(), s.begin(), s.end());
  if (cacheable) {
    if (ts.cache.size() >= kCacheMaxEntries) ts.cache.clear();
    ts.cache.emplace(std::string(piece), s);
  }
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<BpeTokenizerImpl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, &ids);
  return ids;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const { return decode(ids, false); }

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= impl_->vocab_size)
      fail("tokenizer: cannot decode id ", id, " (vocab size ", impl_->vocab_size, ")");
    if (skip_special_tokens && impl_->id_is_special[id]) continue;
    bytes += impl_->id_to_bytes[id];
  }
  return utf8_lossy(bytes);
}

std::vector<std::vector<int32_t>> BpeTokenizer::encode_batch(const std::vector<std::string_view>& texts,
                                                             int num_threads) const {
  std::vector<std::vector<int32_t>> results(texts.size());
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  num_threads = static_cast<int>(std::min<size_t>(num_threads, texts.size()));
  if (num_threads <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) results[i] = encode(texts[i]);
    return results;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    try {
      for (size_t i; (i = next.fetch_add(1)) < texts.size();) results[i] = encode(texts[i]);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = texts.size();
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < num_threads; ++i) threads.emplace_back(worker);
  for (auto& th : threads) th.join();
  if (error) std::rethrow_exception(error);
  return results;
}

int64_t BpeTokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t BpeTokenizer::eos_id() const { return impl_->eos_id; }

// The post-processor's tokens on one side of the text, once the post-processor is one Ingot reads.
static const std::vector<int32_t>& special_side(const BpeTokenizerImpl& t, const std::vector<int32_t>& side) {
  if (!t.unsupported_post_processor.empty())
    fail(t.path, ": post_processor \"", t.unsupported_post_processor,
         "\" is not supported (supported: ByteLevel, TemplateProcessing); its special tokens cannot be added");
  return side;
}

std::vector<int32_t> BpeTokenizer::special_prefix() const { return special_side(*impl_, impl_->special_prefix); }
std::vector<int32_t> BpeTokenizer::special_suffix() const { return special_side(*impl_, impl_->special_suffix); }
std::string BpeTokenizer::name() const { return "bpe"; }

int32_t BpeTokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_to_id.find(token);
  return it == impl_->token_to_id.end() ? -1 : it->second;
}

const std::string& BpeTokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size)
    fail("tokenizer: id ", id, " outside the vocab (size ", impl_->vocab_size, ")");
  return impl_->id_to_token[id];
}

bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->id_is_special[id];
}

std::vector<uint8_t> BpeTokenizer::dropped_bytes() const {
  std::vector<uint8_t> dropped;
  if (impl_->unk_id >= 0) return dropped;
  for (int b = 0; b < 256; ++b)
    if (impl_->byte_id[b] < 0) dropped.push_back(static_cast<uint8_t>(b));
  return dropped;
}

int BpeTokenizer::first_dropped_byte(std::string_view text) const {
  if (impl_->unk_id >= 0) return -1;
  for (const char c : text)
    if (impl_->byte_id[static_cast<uint8_t>(c)] < 0) return static_cast<uint8_t>(c);
  return -1;
}

const std::string* BpeTokenizer::added_token_text(int32_t id) const {
  const auto it = impl_->added_token_text.find(id);
  return it == impl_->added_token_text.end() ? nullptr : &it->second;
}

void BpeTokenizer::set_encode_special_tokens(bool value) { impl_->encode_special_tokens = value; }

}  // namespace ingot::data
