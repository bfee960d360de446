// JSON and file helpers shared by the readers and writers of Hugging Face files (safetensors
// headers, model.safetensors.index.json, config.json). Invariants: every failure throws ingot::Error
// naming the file it came from, and no nlohmann exception escapes these helpers; a file written
// through AtomicFileWriter is either absent/old or complete at its final name, never partial.
// Host-only: include from .cpp files, never from .cu files (see DESIGN.md).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ingot::io {

// Reads a whole regular file of at most kMaxTextFileBytes into memory; errors name `what`, the path
// and the reason (a directory, a FIFO or a device, too large, the OS's).
inline constexpr int64_t kMaxTextFileBytes = int64_t{1} << 30;
std::string read_text_file(const std::string& path, const std::string& what);

// JSON nested deeper than this is refused before parsing: printing or walking such a value
// recurses once a level, and a file of 100k nested brackets overflowed the stack. Real files
// (configs, tokenizers, safetensors headers) nest a few levels.
inline constexpr int kMaxJsonNesting = 512;
void check_json_nesting(std::string_view text, const std::string& source, const std::string& what);

// Parses JSON text (after check_json_nesting); `source` names the file and `what` the document
// ("config", "index") in errors.
nlohmann::json parse_json(const std::string& text, const std::string& source, const std::string& what);

// A JSON library exception's message without its "[json.exception.type_error.302] " prefix.
std::string json_error_text(const nlohmann::json::exception& e);

// Short rendering of a value for error messages ("abc" -> "\"abc\"", long arrays clipped).
std::string json_brief(const nlohmann::json& value);

// value.dump(indent), with bytes that are not UTF-8 written as U+FFFD instead of throwing: strings
// that hold paths (a config file named in Latin-1) must not fail a checkpoint after the training.
std::string dump_json(const nlohmann::json& value, int indent = -1);

// Human name of a JSON type for error messages: "string", "integer", "array", ...
std::string json_type_name(const nlohmann::json& value);

// Streams a file to PATH.tmp-<pid> in the same directory; commit() fsyncs, renames it onto PATH and
// fsyncs the directory. Destroyed without commit() (an exception mid-write), it removes the
// temporary and PATH is untouched.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `bytes` to `path` through AtomicFileWriter.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace ingot::io
