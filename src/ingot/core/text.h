// Small pieces of the wording that messages and reports share.
#pragma once
#include <cstdint>
#include <string>

namespace ingot {

// "1 document", "3 documents": a count with its noun (plural by adding "s").
inline std::string counted(int64_t n, const std::string& noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

}  // namespace ingot
