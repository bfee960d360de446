// Symbolic links that lead nowhere. exists() calls them absent, so an error built on it would send
// the user looking for a file they can see in `ls`; these name the link and where it points.
#pragma once
#include <filesystem>
#include <string>
#include <system_error>

#include "ingot/core/error.h"

namespace ingot {

// "a symbolic link to TARGET, which does not exist" or "a symbolic link loop" for a link that
// resolves to nothing; "" for any other path (a working link, a file, nothing at all).
inline std::string broken_link_description(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return "";
  const fs::file_status target = fs::status(path, ec);
  if (ec == std::errc::too_many_symbolic_link_levels) return "a symbolic link loop";
  if (target.type() != fs::file_type::not_found) return "";
  return "a symbolic link to " + fs::read_symlink(path, ec).string() + ", which does not exist";
}

// Whether an optional file (a model's tokenizer.json, generation_config.json, ...) is there. A
// broken link in its place is an error naming it: taken as absent, a Hugging Face cache snapshot
// whose blob is gone would run on a default (bytes for the tokenizer, no stop id) without a word.
inline bool optional_file_exists(const std::filesystem::path& path) {
  if (const std::string link = broken_link_description(path); !link.empty()) fail(path.string(), " is ", link);
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace ingot
