// NFC per UAX #15: full canonical decomposition (Hangul algorithmically), canonical ordering of
// combining marks, then canonical composition with the blocking rule. The quick check keeps the
// common case (ASCII, Latin-1, CJK, emoji: all NFC already) to a table scan without allocation.
#include "ingot/data/unicode_nfc.h"

#include <algorithm>
#include <vector>

namespace ingot::data {
namespace {

struct CombiningClass {
  char32_t cp;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp;
  uint16_t offset;
  uint8_t length;
};
struct Composition {
  char32_t first, second, composite;
};
struct CodeRange {
  char32_t lo, hi;
};

#include "ingot/data/unicode_nfc_tables.inc"

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
              kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::lower_bound(std::begin(kCombiningClass), std::end(kCombiningClass), cp,
                             [](const CombiningClass& e, char32_t c) { return e.cp < c; });
  return (it != std::end(kCombiningClass) && it->cp == cp) ? it->ccc : 0;
}

bool nfc_unstable(char32_t cp) {
  if (cp < 0x300) return false;
  auto it = std::upper_bound(std::begin(kNfcUnstable), std::end(kNfcUnstable), cp,
                             [](char32_t c, const CodeRange& r) { return c < r.lo; });
  if (it == std::begin(kNfcUnstable)) return false;
  --it;
  return cp <= it->hi;
}

void decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = static_cast<int>(cp - kSBase);
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    auto it = std::lower_bound(std::begin(kDecomposition), std::end(kDecomposition), cp,
                               [](const Decomposition& e, char32_t c) { return e.cp < c; });
    if (it != std::end(kDecomposition) && it->cp == cp) {
      out->insert(out->end(), kDecompositionData + it->offset,
                  kDecompositionData + it->offset + it->length);
      return;
    }
  }
  out->push_back(cp);
}

// The primary composite of (first, second), or 0 when there is none.
char32_t compose_pair(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount)
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount)
    return first + (second - kTBase);
  auto it = std::lower_bound(std::begin(kComposition), std::end(kComposition),
                             Composition{first, second, 0},
                             [](const Composition& a, const Composition& b) {
                               return a.first != b.first ? a.first < b.first : a.second < b.second;
                             });
  if (it != std::end(kComposition) && it->first == first && it->second == second)
    return it->composite;
  return 0;
}

}  // namespace

const char* nfc_unicode_version() {
  return kUnicodeVersion;
}

size_t utf8_find_invalid(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // 8 ASCII bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (b >= 0xC2 && b <= 0xDF)
      len = 2;
    else if (b == 0xE0) {
      len = 3;
      lo = 0xA0;
    } else if (b >= 0xE1 && b <= 0xEC)
      len = 3;
    else if (b == 0xED) {
      len = 3;
      hi = 0x9F;
    }  // no surrogates
    else if (b >= 0xEE && b <= 0xEF)
      len = 3;
    else if (b == 0xF0) {
      len = 4;
      lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3)
      len = 4;
    else if (b == 0xF4) {
      len = 4;
      hi = 0x8F;
    } else
      return i;
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (int k = 2; k < len; ++k)
      if ((s[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string_view::npos;
}

void utf8_append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  if (utf8_find_invalid(bytes) == std::string_view::npos) return std::string(bytes);
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  out.reserve(n + 8);
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF)
      len = 2;
    else if (b == 0xE0) {
      len = 3;
      lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
      len = 3;
    else if (b == 0xED) {
      len = 3;
      hi = 0x9F;
    } else if (b == 0xF0) {
      len = 4;
      lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3)
      len = 4;
    else if (b == 0xF4) {
      len = 4;
      hi = 0x8F;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    // Consume the longest valid prefix of the sequence; an incomplete one becomes one U+FFFD.
    int good = 1;
    for (int k = 1; k < len && i + k < n; ++k) {
      const unsigned char c = s[i + k];
      const bool ok = (k == 1) ? (c >= lo && c <= hi) : ((c & 0xC0) == 0x80);
      if (!ok) break;
      ++good;
    }
    if (good == len) {
      out.append(bytes.substr(i, len));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += good;
  }
  return out;
}

bool nfc_is_normalized(std::string_view text) {
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    if (static_cast<unsigned char>(text[pos]) < 0xCC) {  // lead bytes below 0xCC encode < U+0300
      pos += (static_cast<unsigned char>(text[pos]) < 0x80) ? 1 : 2;
      continue;
    }
    if (nfc_unstable(utf8_next(text, &pos))) return false;
  }
  return true;
}

std::string nfc_normalize(std::string_view text) {
  if (nfc_is_normalized(text)) return std::string(text);
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) decompose(utf8_next(text, &pos), &cps);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j, [](char32_t a, char32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
  // Canonical composition.
  if (!cps.empty()) {
    size_t starter = 0, out = 1;
    int last_class = combining_class(cps[0]) == 0 ? 0 : 256;
    for (size_t i = 1; i < cps.size(); ++i) {
      const char32_t c = cps[i];
      const int c_class = combining_class(c);
      const char32_t composite = compose_pair(cps[starter], c);
      if (composite != 0 && (last_class < c_class || last_class == 0)) {
        cps[starter] = composite;
        continue;
      }
      if (c_class == 0) starter = out;
      last_class = c_class;
      cps[out++] = c;
    }
    cps.resize(out);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : cps) utf8_append(&result, c);
  return result;
}

bool unicode_is_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace ingot::data
