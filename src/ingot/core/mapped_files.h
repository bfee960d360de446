// Memory-mapped input files (token shards, safetensors weights) and what happens when one changes
// under the mapping. A file truncated or overwritten in place while mapped makes the next read of
// a page past its new end raise SIGBUS, which would end the process with no word of which file.
// Each mapping is registered here; a SIGBUS inside one prints an error naming the file and exits
// with status 1; any other SIGBUS goes to the handler installed before (or the default action).
// (Replacing a file by writing a new one and renaming it, as `ingot prepare` and
// `ingot export` do, never causes this: the mapping keeps the old file.)
#pragma once
#include <cstddef>
#include <string>

namespace ingot {

// Registers [begin, begin + bytes) as a mapping of path for its lifetime. Up to kMaxMappedFiles
// mappings at once are named; past that, a SIGBUS in one gets the same error without the name.
class MappedFileRecord {
 public:
  MappedFileRecord() = default;
  MappedFileRecord(const void* begin, size_t bytes, const std::string& path);
  ~MappedFileRecord();
  MappedFileRecord(MappedFileRecord&& other) noexcept;
  MappedFileRecord& operator=(MappedFileRecord&& other) noexcept;
  MappedFileRecord(const MappedFileRecord&) = delete;
  MappedFileRecord& operator=(const MappedFileRecord&) = delete;

 private:
  int slot_ = -1;
};

constexpr int kMaxMappedFiles = 1024;

}  // namespace ingot
