// Small pieces of the wording that messages and reports share.
#pragma once
#include <cstdint>
#include <string>

namespace ingot {

// "1 document", "3 documents": a count with its noun (plural by adding "s").
inline std::string counted(int64_t n, const std::string& noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

// "0xD0": a byte as messages name it.
inline std::string byte_hex(uint8_t byte) {
  constexpr char digits[] = "0123456789ABCDEF";
  return std::string("0x") + digits[byte >> 4] + digits[byte & 15];
}

}  // namespace ingot
