// JSON and file helpers; see json_util.h for the invariants.
#include "ingot/io/json_util.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "ingot/core/error.h"

namespace ingot::io {

std::string read_text_file(const std::string& path, const std::string& what) {
  // Checked before opening: a FIFO would block the open until a writer came, and a device such as
  // /dev/zero would be read until memory ran out.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail("cannot read ", what, " ", path, ": it is a directory");
    if (!S_ISREG(st.st_mode)) fail("cannot read ", what, " ", path, ": it is not a regular file");
    if (st.st_size > kMaxTextFileBytes)
      fail("cannot read ", what, " ", path, ": ", st.st_size, " bytes, more than the ", kMaxTextFileBytes >> 20,
           " MiB a text file of a model, a dataset or a run is read up to");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read ", what, " ", path, ": ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("cannot read ", what, " ", path, ": read error");
  return text.str();
}

void check_json_nesting(std::string_view text, const std::string& source, const std::string& what) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonNesting)
        fail(what, " ", source, " nests arrays or objects deeper than ", kMaxJsonNesting, " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

nlohmann::json parse_json(const std::string& text, const std::string& source, const std::string& what) {
  check_json_nesting(text, source, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(what, " ", source, " is not valid JSON: ", json_error_text(e));
  }
}

std::string json_error_text(const nlohmann::json::exception& e) {
  const std::string text = e.what();
  const size_t end = text.rfind("] ", text.find(' '));
  return text.starts_with("[json.exception.") && end != std::string::npos ? text.substr(end + 2) : text;
}

namespace {

constexpr size_t kBriefMax = 80;

// Appends value to out until out passes kBriefMax characters; levels past the eighth print as
// [...] or {...}. (dump() recurses without bound: a value nested 100k deep overflowed the stack.)
void append_brief(const nlohmann::json& value, int depth, std::string& out) {
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;  // invalid UTF-8: this is a message
  if (!value.is_structured()) {
    out += value.dump(-1, ' ', false, kReplace);
    return;
  }
  const bool array = value.is_array();
  if (depth >= 8) {
    out += array ? "[...]" : "{...}";
    return;
  }
  out += array ? '[' : '{';
  for (auto it = value.begin(); it != value.end() && out.size() <= kBriefMax; ++it) {
    if (it != value.begin()) out += ',';
    if (!array) out += nlohmann::json(it.key()).dump(-1, ' ', false, kReplace) + ':';
    append_brief(*it, depth + 1, out);
  }
  out += array ? ']' : '}';
}

}  // namespace

std::string dump_json(const nlohmann::json& value, int indent) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_brief(const nlohmann::json& value) {
  std::string text;
  try {
    append_brief(value, 0, text);
  } catch (const nlohmann::json::exception&) {
    text = "<unprintable>";
  }
  if (text.size() > kBriefMax) text = text.substr(0, kBriefMax) + "...";
  return text;
}

std::string json_type_name(const nlohmann::json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "number";
  return value.type_name();
}

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), temp_path_(path + ".tmp-" + std::to_string(::getpid())) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create ", temp_path_, " (to write ", path_, "): ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write ", temp_path_, " (for ", path_, "): ", std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  // fsync before rename: otherwise a crash can leave the new name pointing at unwritten blocks.
  if (::fsync(fd_) != 0) fail("cannot fsync ", temp_path_, ": ", std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("cannot close ", temp_path_, ": ", std::strerror(errno));
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
    fail("cannot rename ", temp_path_, " to ", path_, ": ", std::strerror(errno));
  committed_ = true;
  // Persist the directory entry too; failure here is not fatal (some filesystems refuse it).
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  AtomicFileWriter file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace ingot::io
