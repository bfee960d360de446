// Path checks that several commands share.
#pragma once
#include <filesystem>
#include <system_error>

namespace ingot {

// Whether `path` names the file system's root ("/", "//", "/..", a link to "/"): train, prepare and
// export refuse it as an output folder, where their files would mix with the whole system. False
// for an empty path and wherever the path cannot be resolved.
inline bool is_filesystem_root(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return false;
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  if (ec) return false;
  const fs::path resolved = fs::weakly_canonical(absolute, ec);
  return !ec && !resolved.empty() && resolved == resolved.root_path();
}

}  // namespace ingot
