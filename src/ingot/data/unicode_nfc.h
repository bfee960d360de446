// Unicode helpers for the tokenizer: UTF-8 validation and decoding, NFC normalization, and the
// character classes that Hugging Face `tokenizers` takes from Rust's char methods.
// Invariants: every function here takes valid UTF-8 (check with utf8_find_invalid first) and
// returns valid UTF-8. NFC tables come from tools/gen_unicode_nfc.py (unicode_nfc_tables.inc).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ingot::data {

// Byte offset of the first ill-formed UTF-8 sequence (overlong forms, surrogates and code points
// above U+10FFFF are ill-formed), or std::string_view::npos when the text is valid.
size_t utf8_find_invalid(std::string_view text);

// Decodes the code point at text[*pos] and advances *pos past it. Text must be valid UTF-8.
inline char32_t utf8_next(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = *pos;
  const unsigned char b = s[i];
  if (b < 0x80) {
    *pos = i + 1;
    return b;
  }
  if (b < 0xE0) {
    *pos = i + 2;
    return (char32_t(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
  }
  if (b < 0xF0) {
    *pos = i + 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
  }
  *pos = i + 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(s[i + 1] & 0x3F) << 12) |
         (char32_t(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
}

void utf8_append(std::string* out, char32_t cp);

// Replaces each maximal ill-formed subsequence by U+FFFD, as Rust's String::from_utf8_lossy does.
std::string utf8_lossy(std::string_view bytes);

// True when `text` is certainly in NFC already (the NFC quick check answered YES).
bool nfc_is_normalized(std::string_view text);
// Canonical decomposition, canonical ordering, canonical composition (UAX #15).
std::string nfc_normalize(std::string_view text);
const char* nfc_unicode_version();

// Rust's char::is_whitespace (the White_Space property).
bool unicode_is_whitespace(char32_t cp);

}  // namespace ingot::data
