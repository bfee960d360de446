#include "ingot/data/prepare.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <span>
#include <sstream>

#include "ingot/core/broken_link.h"
#include "ingot/core/dir_lock.h"
#include "ingot/core/error.h"
#include "ingot/core/paths.h"
#include "ingot/core/process.h"
#include "ingot/core/stop_signals.h"
#include "ingot/core/text.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/data/chat_format.h"
#include "ingot/data/unicode_nfc.h"
#include "ingot/data/shard.h"
#include "ingot/io/json_util.h"

namespace ingot::data {

namespace fs = std::filesystem;

namespace {

struct InputFile {
  fs::path path;
  bool from_directory;      // found by walking a directory (binary files are skipped, not read)
  bool json_lines = false;  // read as JSON Lines (reads_as_json_lines), else as plain text
};

bool is_hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

// The extension in lower case: DATA.JSONL is JSON Lines too.
std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return ext;
}

bool is_jsonl(const fs::path& p) {
  const std::string ext = lower_extension(p);
  return ext == ".jsonl" || ext == ".ndjson";
}

// Whether s is one JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
bool is_json_number(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i > from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') ++i;
  else if (!digits()) return false;
  if (i < s.size() && s[i] == '.' && (++i, !digits())) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    if (++i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

// Python's json.dumps writes NaN, Infinity and -Infinity, and json.loads takes numbers beyond a
// double's range (1e999 as inf); JSON has no such values, so the parser refuses the line, and a
// whole record whose text was fine stopped the prepare. The line with each of these values outside
// strings written as null, or nullopt where it holds none. A malformed number stays as it is, and
// the line invalid.
std::optional<std::string> python_json_values_as_null(std::string_view line) {
  std::string out;
  bool changed = false, in_string = false;
  for (size_t i = 0; i < line.size();) {
    const char c = line[i];
    if (in_string) {
      const size_t n = c == '\\' && i + 1 < line.size() ? 2 : 1;  // an escape and what it escapes
      if (c == '"') in_string = false;
      out += line.substr(i, n);
      i += n;
      continue;
    }
    auto literal = [&](std::string_view word) {
      const size_t end = i + word.size();
      return line.compare(i, word.size(), word) == 0 &&
             (end == line.size() || !std::isalnum(static_cast<unsigned char>(line[end])));
    };
    if (const std::string_view word = literal("NaN") ? "NaN" : literal("Infinity") ? "Infinity"
                                      : literal("-Infinity") ? "-Infinity" : "";
        !word.empty()) {
      out += "null";
      changed = true;
      i += word.size();
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = i + 1;
      while (end < line.size() && (std::isdigit(static_cast<unsigned char>(line[end])) ||
                                   std::string_view(".eE+-").find(line[end]) != std::string_view::npos))
        ++end;
      const std::string number(line.substr(i, end - i));
      const bool beyond = is_json_number(number) && std::isinf(std::strtod(number.c_str(), nullptr));
      out += beyond ? std::string("null") : number;
      changed |= beyond;
      i = end;
    } else {
      in_string = c == '"';
      out += c;
      ++i;
    }
  }
  if (!changed) return std::nullopt;
  return out;
}

// A line the parser refused, read as Python's json reads it (python_json_values_as_null); nullopt
// where it holds no such value or is invalid all the same.
std::optional<nlohmann::json> parse_python_json_line(std::string_view line) {
  const std::optional<std::string> nulled = python_json_values_as_null(line);
  if (!nulled) return std::nullopt;
  nlohmann::json record = nlohmann::json::parse(*nulled, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded()) return std::nullopt;
  return record;
}

// The lines of a stream, each ending at "\n", "\r\n" or a lone "\r" (the old Mac convention: read
// at "\n" alone, a CR-only JSON Lines file was one invalid record, and `--skip-invalid-json` dropped
// every record in it as one line). No JSON record holds a raw CR, so splitting there is safe.
class LineReader {
 public:
  explicit LineReader(std::istream& in) : in_(in) {}

  // The next line without its terminator, and the bytes it took with the terminator; false at the
  // end of the stream.
  bool next(std::string& line, int64_t& bytes) {
    if (pos_ == std::string::npos) {
      if (!std::getline(in_, physical_)) return false;
      newline_ = in_.eof() ? 0 : 1;
      crlf_ = !physical_.empty() && physical_.back() == '\r' ? 1 : 0;
      if (crlf_) physical_.pop_back();
      pos_ = 0;
    }
    const size_t cr = physical_.find('\r', pos_);
    if (cr == std::string::npos) {
      line.assign(physical_, pos_);
      bytes = static_cast<int64_t>(physical_.size() - pos_) + newline_ + crlf_;
      pos_ = std::string::npos;
    } else {
      line.assign(physical_, pos_, cr - pos_);
      bytes = static_cast<int64_t>(cr - pos_) + 1;
      pos_ = cr + 1;
    }
    return true;
  }

 private:
  std::istream& in_;
  std::string physical_;         // up to the next "\n"
  size_t pos_ = std::string::npos;  // where the next line starts in physical_; npos: read another
  int newline_ = 0, crlf_ = 0;   // bytes of the "\n" and of a "\r" before it
};

constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

// The length of the line break at text[at]: 2 for "\r\n", 1 for a lone "\n" or "\r", 0 for none.
size_t line_break_length(std::string_view text, size_t at) {
  if (at >= text.size()) return 0;
  if (text[at] == '\n') return 1;
  if (text[at] != '\r') return 0;
  return at + 1 < text.size() && text[at + 1] == '\n' ? 2 : 1;
}

// A .json file (any case) whose first non-blank line is a JSON object with the string field
// text_field: JSON Lines under the name `datasets`' to_json gives them, which Hugging Face's json
// loader reads record by record. Read as plain text, its raw JSON was trained on, with exit 0. A
// .json file of another shape (an array, a config, code data) stays text.
bool json_file_of_json_lines(const fs::path& p, const std::string& text_field) {
  if (lower_extension(p) != ".json") return false;
  std::ifstream in(p, std::ios::binary);
  LineReader lines(in);
  std::string line;
  int64_t bytes = 0;
  while (lines.next(line, bytes)) {
    if (line.starts_with(kUtf8Bom)) line.erase(0, 3);  // a UTF-8 BOM, as the JSON Lines reader takes it
    if (line.find_first_not_of(" \t\r\f\v") == std::string::npos) continue;
    nlohmann::json first = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (first.is_discarded()) first = parse_python_json_line(line).value_or(first);
    if (!first.is_object()) return false;
    const auto field = first.find(text_field);
    return field != first.end() && field->is_string();
  }
  return false;
}

bool reads_as_json_lines(const InputFile& f) { return f.json_lines; }

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("prepare: cannot open ", path.string(), ": ", std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail("prepare: cannot read ", path.string());
  return std::move(s).str();
}

// Whether the file's first 64 KiB hold a NUL byte: binary, such as a token shard, never JSON Lines.
bool starts_binary(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(64 << 10, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return head.find('\0') != std::string::npos;
}

// A JSON Lines line of JSON's blanks only (and \v, \f), read as no record.
bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
}

// A document of whitespace only, skipped and counted: Unicode's White_Space, so a document of
// no-break or ideographic spaces (U+00A0, U+3000) too, which ASCII's blanks alone let through to
// be trained on. Ill-formed UTF-8 is no whitespace.
bool is_blank_document(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (length > 1 && (i + length > s.size() || utf8_find_invalid(s.substr(i, length)) != std::string_view::npos))
      return false;
    if (!unicode_is_whitespace(utf8_next(s, &i))) return false;
  }
  return true;
}

// Whether folder is root or holds it (both real paths).
bool holds(const fs::path& folder, const fs::path& root) {
  return std::mismatch(folder.begin(), folder.end(), root.begin(), root.end()).first == folder.end();
}

// The files under folder, in the order of their paths compared one component after another (each
// folder's entries sorted by name, and walked in that order). Links to folders are followed, each
// real folder once (walked holds those entered), so a link loop ends, except a link to a folder that
// holds the input (root, a real path; `up -> ..` would walk the input's whole parent). A broken
// link, a folder that cannot be listed and an entry that cannot be looked at are errors naming
// them: passed over, they shrank the dataset without a word.
void walk_directory(const fs::path& folder, const fs::path& root, const fs::path& output, std::set<fs::path>& walked,
                    std::vector<fs::path>& found) {
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (!is_hidden(it->path())) entries.push_back(it->path());
  if (ec) fail("prepare: cannot list folder ", folder.string(), ": ", ec.message());
  std::sort(entries.begin(), entries.end());
  for (const fs::path& p : entries) {
    if (const std::string link = broken_link_description(p); !link.empty())
      fail("prepare: ", p.string(), " is ", link, " (remove it, or name the inputs to read)");
    const fs::file_status status = fs::status(p, ec);  // through a link
    if (ec) fail("prepare: cannot look at ", p.string(), ": ", ec.message());
    if (fs::is_directory(status)) {
      const fs::path real = fs::weakly_canonical(p, ec);
      if (real != output && !holds(real, root) && walked.insert(real).second)
        walk_directory(p, root, output, walked, found);
      continue;
    }
    // An earlier dataset inside an input directory: its shards are binary (skipped below), and
    // its meta.json and the tokenizer files `ingot prepare` copies beside them are not text to
    // train on.
    if ((p.filename() == "meta.json" || is_tokenizer_file_name(p.filename().string())) &&
        fs::exists(p.parent_path() / "train-00000.bin", ec))
      continue;
    if (fs::is_regular_file(status)) found.push_back(p);
  }
}

// Inputs expanded to files in a deterministic order, each real file once; the inputs that named a
// file already named go to *repeated (repeating a file does not upsample it: the report says so).
std::vector<InputFile> collect_inputs(const PrepareOptions& options, std::vector<std::string>* repeated) {
  INGOT_CHECK(!options.inputs.empty(), "prepare: no inputs given");
  std::error_code ec;
  const fs::path output = fs::weakly_canonical(options.output_dir, ec);
  std::vector<InputFile> files;
  std::set<fs::path> seen;
  auto add = [&](const fs::path& p, bool from_directory) {
    const fs::path canonical = fs::weakly_canonical(p, ec);
    if (!seen.insert(ec ? p : canonical).second) {
      if (!from_directory) repeated->push_back(p.string());
      return;
    }
    files.push_back({p, from_directory});
  };
  for (const std::string& input : options.inputs) {
    const fs::path root(input);
    if (fs::is_directory(root, ec)) {
      std::vector<fs::path> found;
      const fs::path root_real = fs::weakly_canonical(root, ec);
      std::set<fs::path> walked{root_real};
      walk_directory(root, root_real, output, walked, found);
      for (const fs::path& p : found) add(p, true);
    } else if (fs::is_regular_file(root, ec)) {
      add(root, false);
    } else {
      // Why not, where the file system says (no such file, a name too long, a folder that cannot
      // be searched).
      (void)fs::status(root, ec);
      if (ec) fail("prepare: input ", input, ": ", ec.message());
      fail("prepare: input ", input, " is not a file or directory");
    }
  }
  return files;
}

// Splits documents across shards of at most shard_tokens tokens, naming them train-NNNNN.bin.
class ShardSink {
 public:
  ShardSink(const PrepareOptions& options, const Tokenizer& tokenizer, PrepareReport& report,
            bool has_loss_mask)
      : options_(options),
        report_(report),
        vocab_size_(static_cast<uint32_t>(tokenizer.vocab_size())),
        width_(shard_token_width_for_vocab(tokenizer.vocab_size())),
        has_loss_mask_(has_loss_mask) {}

  // mask: empty, or one 0/1 byte per token when the shards have a loss mask.
  void add(std::span<const int32_t> tokens, std::span<const uint8_t> mask = {}) {
    while (!tokens.empty()) {
      if (!writer_) open();
      const int64_t space = options_.shard_tokens - writer_->num_tokens();
      if (static_cast<int64_t>(tokens.size()) <= space) {
        writer_->add_document(tokens, mask);
        return;
      }
      if (writer_->num_tokens() > 0) {  // does not fit: start a fresh shard
        close();
        continue;
      }
      // Longer than a whole shard: split it.
      writer_->add_document(tokens.first(space), mask.empty() ? mask : mask.first(space));
      tokens = tokens.subspan(space);
      if (!mask.empty()) mask = mask.subspan(space);
      close();
    }
  }

  void close() {
    if (!writer_) return;
    writer_->finish();
    report_.shards.push_back({fs::path(writer_->path()).filename().string(), writer_->num_tokens(),
                              writer_->num_documents()});
    if (options_.log)
      // The file's name alone: it is written in the staging folder, and moved when all is done.
      *options_.log << "prepare: wrote " << fs::path(writer_->path()).filename().string() << " ("
                    << counted(writer_->num_tokens(), "token") << ", " << counted(writer_->num_documents(), "document") << ")\n";
    writer_.reset();
  }

  // Drops the shard in progress (its writer removes the .tmp file).
  void abandon() { writer_.reset(); }

 private:
  void open() {
    char name[32];
    std::snprintf(name, sizeof name, "train-%05zu.bin", report_.shards.size());
    writer_ = std::make_unique<ShardWriter>((fs::path(options_.output_dir) / name).string(), width_,
                                            vocab_size_, has_loss_mask_);
  }

  const PrepareOptions& options_;
  PrepareReport& report_;
  uint32_t vocab_size_, width_;
  bool has_loss_mask_;
  std::unique_ptr<ShardWriter> writer_;
};

// dir/meta.json if `ingot prepare` wrote it ("format": "ingot-token-shards"), else null.
nlohmann::json prepare_meta(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "meta.json", ec)) return nullptr;
  nlohmann::json meta = nlohmann::json::parse(read_file(dir / "meta.json"), nullptr, /*allow_exceptions=*/false);
  const bool ours = meta.is_object() && meta.contains("format") && meta["format"] == "ingot-token-shards";
  return ours ? meta : nlohmann::json(nullptr);
}

// The names prepare gives its shards (train-<digits>.bin) and their temporary names.
bool is_shard_name(const std::string& name) {
  const std::string prefix = "train-";
  const size_t digits_end = name.find_first_not_of("0123456789", prefix.size());
  return name.rfind(prefix, 0) == 0 && digits_end != prefix.size() && digits_end != std::string::npos &&
         (name.compare(digits_end, std::string::npos, ".bin") == 0 ||
          name.compare(digits_end, std::string::npos, ".bin.tmp") == 0);
}

// The tokenizer files the dataset in dir brought with it: those its meta.json lists in
// "tokenizer_files" (since 2026-12-01); for an older BPE dataset, any of kTokenizerFilesBesideShards
// (prepare copied them); none for a byte-level one or without meta.json. A tokenizer file in dir
// that is not one of these is someone else's (a model's folder), and no prepare moves it.
std::set<std::string> tokenizer_files_of(const nlohmann::json& meta) {
  if (meta.is_null()) return {};
  std::set<std::string> names;
  if (meta.contains("tokenizer_files") && meta["tokenizer_files"].is_array()) {
    for (const nlohmann::json& name : meta["tokenizer_files"])
      if (name.is_string() && is_tokenizer_file_name(name.get<std::string>())) names.insert(name.get<std::string>());
  } else if (meta.contains("tokenizer") && meta["tokenizer"] != "byte") {
    names.insert(kTokenizerFilesBesideShards.begin(), kTokenizerFilesBesideShards.end());
  }
  return names;
}
std::set<std::string> dataset_tokenizer_files(const fs::path& dir) { return tokenizer_files_of(prepare_meta(dir)); }

// The files of an earlier dataset in dir: shards, meta.json and its tokenizer files (a byte-level
// --overwrite left a BPE dataset's tokenizer.json behind, which checkpoints then carried). Files
// only, under prepare's own names, and meta.json only if prepare wrote it: --overwrite used to
// take any train-*.bin (a folder too, with what it held) and any meta.json for a dataset's.
std::vector<fs::path> dataset_files(const fs::path& dir) {
  std::vector<fs::path> files;
  const nlohmann::json meta = prepare_meta(dir);
  const std::set<std::string> tokenizer_files = tokenizer_files_of(meta);
  const bool ours = !meta.is_null();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file(ec) && ((name == "meta.json" && ours) || name == "meta.json.tmp" ||
                                      is_shard_name(name) || tokenizer_files.contains(name)))
      files.push_back(entry.path());
  }
  return files;
}

// What in dir a dataset written there would collide with, or a training run on dir would take
// for part of it, and that no prepare wrote: a meta.json of another kind, a folder under a
// shard's or meta.json's name, a .bin file under another name (training reads every *.bin file
// of a data folder). Named, so that the user moves it; nothing of the user's is replaced.
void refuse_foreign_entries(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool regular = entry.is_regular_file(ec);
    std::string why;
    if (name == "meta.json" && prepare_meta(dir).is_null())
      why = regular ? "a meta.json that no `ingot prepare` wrote (it lacks \"format\": \"ingot-token-shards\"), "
                      "which the dataset's would replace"
                    : "a meta.json that is not a file, where the dataset's goes";
    else if ((name == "meta.json.tmp" || is_shard_name(name)) && !regular)
      why = name + ", which is not a file, under a name the dataset's files take";
    else if (regular && entry.path().extension() == ".bin" && !is_shard_name(name))
      why = name + ", which is no shard of a prepared dataset, but which training on the folder would read as one "
                   "(it reads every *.bin file)";
    if (!why.empty())
      fail("prepare: output directory ", dir.string(), " holds ", why, "; move it, or choose another directory");
  }
}

// The tokenizer files the new dataset carries: (source, name in the dataset). For chat data the
// tokenizer_config.json (and chat_template.jinja) are those of the chat template that rendered it,
// so that an export ships the template the model was trained on.
std::vector<std::pair<fs::path, std::string>> tokenizer_files_to_copy(const PrepareOptions& options) {
  static_assert(kTokenizerFilesBesideShards.size() == 3);
  std::vector<std::pair<fs::path, std::string>> files;
  if (options.tokenizer_file.empty()) return files;
  files.emplace_back(options.tokenizer_file, kTokenizerFilesBesideShards[0]);
  fs::path config = fs::path(options.tokenizer_file).parent_path() / kTokenizerFilesBesideShards[1];
  if (options.format != PrepareFormat::text && !options.chat_template.empty())
    config = fs::is_directory(options.chat_template) ? fs::path(options.chat_template) / kTokenizerFilesBesideShards[1]
                                                     : fs::path(options.chat_template);
  if (!optional_file_exists(config)) return files;
  files.emplace_back(config, kTokenizerFilesBesideShards[1]);
  // The template file only where it is the template in use: beside a config named otherwise, which
  // has its own template, it would override that one in the dataset's folder.
  if (const std::string jinja = chat_template_file_in_use(config.string()); !jinja.empty())
    files.emplace_back(jinja, kTokenizerFilesBesideShards[2]);
  return files;
}

// Creates the output directory; refuses one holding a dataset unless overwrite is on. Nothing is
// deleted here: the new dataset is built aside and replaces the old one only once it is complete.
// Returns the outermost directory it created (empty if the output directory existed).
void tidy_killed_staging(const fs::path& out, std::ostream* log);

fs::path check_output(const PrepareOptions& options, const std::vector<InputFile>& inputs) {
  const fs::path dir(options.output_dir);
  std::error_code ec;
  // As `ingot train` refuses it: the shards and meta.json would mix with the whole file system.
  if (is_filesystem_root(dir))
    fail("prepare: output directory ", dir.string(), " is the file system's root; give the dataset a folder of its own");
  fs::path outermost_new;
  for (fs::path p = fs::absolute(dir); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    outermost_new = p;
    if (p == p.root_path()) break;
  }
  // A training run's folder or a checkpoint (export refuses these too).
  if (fs::is_directory(dir, ec)) {
    if (directory_in_use(dir.string()))
      fail("prepare: output directory ", dir.string(), " is the output_dir of an ingot run in progress; choose another");
    if (const std::string held = training_output_marker(dir.string()); !held.empty())
      fail("prepare: output directory ", dir.string(), " holds a training run or a checkpoint (", held,
           "); choose another directory");
  }
  fs::create_directories(dir, ec);
  if (ec) fail("prepare: cannot create output directory ", dir.string(), ": ", ec.message());
  // First: a note about a dataset a killed prepare set aside comes before any refusal below.
  tidy_killed_staging(dir, options.log);
  refuse_foreign_entries(dir);
  const std::vector<fs::path> old = dataset_files(dir);
  INGOT_CHECK(old.empty() || options.overwrite, "prepare: output directory ", dir.string(), " already holds ",
              old.empty() ? "" : old.front().filename().string(), " (", counted(int64_t(old.size()), "dataset file"),
              "); choose another directory or set overwrite (--overwrite)");
  // An input named on the command line among the files --overwrite replaces would be read, then
  // replaced by what it became. (A directory's walk passes over the output folder.) One stat a
  // file: a corpus of many files over a dataset of many shards made pairwise checks slow.
  std::set<std::pair<dev_t, ino_t>> old_ids;
  for (const fs::path& file : old)
    if (struct stat st; ::stat(file.c_str(), &st) == 0) old_ids.insert({st.st_dev, st.st_ino});
  for (const InputFile& input : inputs)
    if (struct stat st; !input.from_directory && ::stat(input.path.c_str(), &st) == 0 &&
                        old_ids.contains({st.st_dev, st.st_ino}))
      fail("prepare: input ", input.path.string(), " is a file of the dataset in ", dir.string(),
           " that this prepare would replace (--overwrite); write the new dataset to another directory");
  // A tokenizer file that belongs to no dataset (the folder of a model, say) is the user's own:
  // never replaced by another (an identical one stays as it is: see kept_tokenizer_files).
  const std::set<std::string> ours = dataset_tokenizer_files(dir);
  for (const auto& [src, name] : tokenizer_files_to_copy(options))
    INGOT_CHECK(ours.contains(name) || !fs::exists(dir / name) || read_file(src) == read_file(dir / name),
                "prepare: output directory ", dir.string(), " holds a ", name, " that is not part of a dataset and "
                "differs from ", src.string(), ", which the dataset would put there; choose another directory (or "
                "delete it, if an earlier prepare left it there)");
  return outermost_new;
}

// A prepare that fails takes back the directories it created for its output, innermost first and
// only while empty, so nothing is left that was not there before (the staging folder inside is
// gone by then).
struct CreatedOutputDir {
  fs::path path, outermost_new;
  ~CreatedOutputDir() {
    if (outermost_new.empty()) return;
    std::error_code ec;
    for (fs::path p = fs::absolute(path); fs::is_empty(p, ec) && !ec; p = p.parent_path()) {
      fs::remove(p, ec);
      if (ec || p == outermost_new) break;
    }
  }
};

// The .prepare-<pid>[-k] folders in out whose prepare is gone (killed).
std::vector<fs::path> killed_staging_folders(const fs::path& out) {
  std::vector<fs::path> folders;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = ".prepare-";  // then <pid>, or <pid>-<k> (fresh_pid_path)
    const int64_t pid = pid_suffix(name.substr(0, name.find('-', prefix.size())), prefix);
    if (pid >= 0 && pid != ::getpid() && !process_exists(pid) && entry.is_directory(ec)) folders.push_back(entry.path());
  }
  return folders;
}

// Killed prepares' folders in out. One holding a dataset in old/ was killed while swapping datasets:
// old/ is the dataset it had set aside, kept and named. One holding its new dataset's meta.json was
// killed while moving that dataset in (out's shards may be part of it): kept, so that training stays
// refused, until a prepare completes there. Any other holds the partial output of a killed prepare
// (up to a dataset's size): removed, and said so.
void tidy_killed_staging(const fs::path& out, std::ostream* log) {
  std::error_code ec;
  for (const fs::path& folder : killed_staging_folders(out)) {
    if (holds_set_aside_dataset(folder.string())) {
      if (log)
        *log << "note: " << (folder / "old").string() << " holds a dataset that an `ingot prepare --overwrite`, "
             << "since killed, had set aside; move its files back to restore it, or delete " << folder.string() << "\n";
      continue;
    }
    if (holds_staged_dataset(folder.string())) {
      if (log)
        *log << "note: " << folder.string() << " holds the rest of a dataset that an `ingot prepare`, since killed, "
             << "was moving into " << out.string() << "; its shards there may be partial until a prepare completes\n";
      continue;
    }
    if (fs::exists(folder / "superseded")) continue;  // kept, and named when it was superseded
    fs::remove_all(folder, ec);
    if (log && !ec) *log << "note: removed " << folder.string() << ", the partial output of a killed prepare\n";
  }
}

// After a prepare has completed in out, what killed prepares left there is no longer a swap or a
// move-in in progress. A dataset one had set aside (old/) is renamed superseded/, which neither the
// loader nor a later prepare takes for a swap in progress, and kept (it may be the user's only copy
// of an older dataset); left as old/, it stopped every training run on the folder for good. The rest
// of a dataset one was moving in (its shards and meta.json, which this prepare's dataset replaces)
// is removed, and so is a folder left with nothing to keep.
void settle_killed_prepares(const fs::path& out, std::ostream* log) {
  for (const fs::path& folder : killed_staging_folders(out)) {
    std::error_code ec;
    if (holds_set_aside_dataset(folder.string())) {
      fs::rename(folder / "old", folder / "superseded", ec);
      if (log && !ec)
        *log << "note: " << (folder / "superseded").string() << " holds the dataset a killed `ingot prepare "
             << "--overwrite` had set aside, which this prepare's dataset replaces; it is kept, to delete when no "
             << "longer needed\n";
    }
    if (!holds_staged_dataset(folder.string())) continue;
    bool keeps = false;
    std::vector<fs::path> rest;
    const bool set_aside = holds_set_aside_dataset(folder.string());  // old/ could not be renamed
    for (const auto& entry : fs::directory_iterator(folder, ec)) {
      const std::string name = entry.path().filename().string();
      if (name == "superseded" || (name == "old" && set_aside)) keeps = true;  // a dataset set aside
      else rest.push_back(entry.path());
    }
    for (const fs::path& p : rest) fs::remove_all(p, ec);
    if (!keeps) fs::remove_all(folder, ec);
    if (log) *log << "note: removed the rest of a dataset that a killed prepare was moving in, from " << folder.string() << "\n";
  }
}

// A hidden folder inside the output directory (same filesystem, so the final moves are renames;
// hidden, so a later prepare of the parent skips it). Removed unless commit() ran. Its name is
// fresh (fresh_pid_path).
struct StagingDir {
  fs::path path;
  bool committed = false;
  explicit StagingDir(const fs::path& out) {  // check_output has tidied killed prepares' folders
    path = fresh_pid_path(out, ".prepare-");
    fs::create_directories(path);
  }
  ~StagingDir() {
    std::error_code ec;
    if (!committed) fs::remove_all(path, ec);
  }
  // Old dataset aside (into this folder), new one in (shards first, meta.json, the mark of a
  // complete dataset, last), and only then the old one deleted. A failure midway moves the old
  // dataset back: deleting it first lost both datasets when a later rename failed.
  void commit(const fs::path& out, bool overwrite, std::ostream* log) {
    const fs::path old_dir = path / "old";
    std::vector<fs::path> set_aside, moved_in;
    // Checked again here, not only at the start: another prepare into the same folder may have
    // finished meanwhile, and its dataset was replaced without a word (both said they had written it).
    // So may a file of the user's have come, which no rename may replace.
    refuse_foreign_entries(out);
    std::vector<fs::path> old_files = dataset_files(out);
    if (!overwrite && !old_files.empty())
      fail("prepare: output directory ", out.string(), " now holds a dataset (", old_files.front().filename().string(),
           ") that another process wrote while this prepare ran; it is left as it is, and this prepare's output is "
           "discarded. Run one prepare at a time per directory, or set overwrite (--overwrite)");
    // old/ only when there is a dataset to set aside: a prepare killed here with an empty old/ left
    // what the next prepare and the loader take for a dataset set aside.
    if (!old_files.empty()) fs::create_directories(old_dir);
    try {
      // meta.json last: until it goes, it still claims the old dataset's tokenizer files.
      std::stable_partition(old_files.begin(), old_files.end(), [](const fs::path& p) { return p.filename() != "meta.json"; });
      for (const fs::path& p : old_files) {
        fs::rename(p, old_dir / p.filename());
        set_aside.push_back(p);
      }
      std::vector<fs::path> staged = dataset_files(path);
      std::stable_partition(staged.begin(), staged.end(), [](const fs::path& p) { return p.filename() != "meta.json"; });
      for (const fs::path& p : staged) {
        fs::rename(p, out / p.filename());
        moved_in.push_back(out / p.filename());
      }
    } catch (...) {
      std::error_code ec;
      for (const fs::path& p : moved_in) fs::remove(p, ec);
      for (const fs::path& p : set_aside) fs::rename(old_dir / p.filename(), p, ec);
      throw;
    }
    committed = true;
    // The old dataset goes. Renamed first: a prepare killed while deleting it leaves no old/
    // (which the next prepare and the loader take for a whole dataset set aside, to be moved
    // back), only a partial output, which the next prepare removes.
    std::error_code ec;
    fs::rename(old_dir, path / "discarded", ec);
    fs::remove_all(path, ec);  // what a failure here leaves is hidden and inert
    // What killed prepares were swapping or moving in here is replaced now.
    settle_killed_prepares(out, log);
  }
};

}  // namespace

bool holds_set_aside_dataset(const std::string& staging_folder) {
  std::error_code ec;
  const fs::path old_dir = fs::path(staging_folder) / "old";
  return fs::is_directory(old_dir, ec) && !fs::is_empty(old_dir, ec);
}

bool holds_staged_dataset(const std::string& staging_folder) {
  std::error_code ec;
  return fs::exists(fs::path(staging_folder) / "meta.json", ec);
}

namespace {

// Progress on the log stream: share of input bytes, MB/s, ETA; at most one line per 0.5 s.
class Progress {
 public:
  Progress(std::ostream* log, bool tty, int64_t total_bytes)
      : log_(log), tty_(tty), total_(std::max<int64_t>(total_bytes, 1)) {}
  void advance(int64_t bytes) {
    done_ += bytes;
    if (!log_) return;
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(500)) return;
    last_ = now;
    print(false);
  }
  void finish() {
    if (log_ && printed_) print(true);
  }

 private:
  using Clock = std::chrono::steady_clock;
  void print(bool final) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    const double fraction = std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
    const double rate = static_cast<double>(done_) / std::max(seconds, 1e-9);
    const double eta = rate > 0 ? static_cast<double>(total_ - std::min(done_, total_)) / rate : 0;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(fraction * kWidth);
    char line[200];
    std::snprintf(line, sizeof line, "prepare: [%s%s] %5.1f%% %.1f/%.1f MB, %.1f MB/s, ETA %.0fs",
                  std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                  100 * fraction, done_ / 1e6, total_ / 1e6, rate / 1e6, eta);
    *log_ << (tty_ ? "\r" : "") << line << (tty_ && !final ? "" : "\n") << std::flush;
    printed_ = true;
  }
  std::ostream* log_;
  bool tty_;
  int64_t total_, done_ = 0;
  bool printed_ = false;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

// One document waiting to be encoded, and where it came from (FILE:LINE) for error messages.
struct PendingDocument {
  std::string where;
  std::string text;                   // text format: the document; chat: the rendered conversation
  RenderedChat chat;                  // chat / alpaca only
  std::vector<ChatMessage> messages;  // chat / alpaca only
  int64_t input_bytes = 0;            // for the progress line
  std::string file;                   // a plain-text file's document: that file, and
  int64_t first_line = 0;             //   the line it starts on (else "" and 0)
};

// Where a document's first invalid UTF-8 byte is, as a reader finds it: the file line of a
// plain-text document ("FILE:LINE: ... at column C"), or the byte of a JSON Lines record's text
// field. The tokenizer's own message counts bytes from the document's start, which read as a file
// offset. "" when the text is valid UTF-8.
std::string invalid_utf8_position(const PendingDocument& d) {
  const size_t bad = utf8_find_invalid(d.text);
  if (bad == std::string_view::npos) return "";
  const std::string byte = byte_hex(static_cast<uint8_t>(d.text[bad]));
  if (d.first_line <= 0)
    return d.where + ": invalid UTF-8 (byte " + byte + ") at byte " + std::to_string(bad) + " of its text";
  const std::string_view before = std::string_view(d.text).substr(0, bad);
  const size_t line_start = before.find_last_of("\r\n");
  int64_t line = d.first_line;
  for (size_t i = 0; i < before.size();) {
    const size_t line_break = line_break_length(before, i);
    line += line_break > 0;
    i += std::max<size_t>(line_break, 1);
  }
  const size_t column = line_start == std::string_view::npos ? bad + 1 : bad - line_start;
  return d.file + ":" + std::to_string(line) + ": invalid UTF-8 (byte " + byte + ") at column " + std::to_string(column);
}

// Encodes documents in batches (several threads for a BPE tokenizer), then masks, truncates or
// drops them and hands them to the sink, in input order.
class DocumentEncoder {
 public:
  DocumentEncoder(const PrepareOptions& options, const Tokenizer& tokenizer, int32_t eos_id,
                  const ChatFormat* format, ShardSink& sink, PrepareReport& report,
                  Progress& progress)
      : options_(options),
        tokenizer_(tokenizer),
        eos_id_(eos_id),
        bpe_(dynamic_cast<const BpeTokenizer*>(&tokenizer)),
        format_(format),
        sink_(sink),
        report_(report),
        progress_(progress) {
    if (!format && options.add_special_tokens) {
      try {
        prefix_ = tokenizer.special_prefix(), suffix_ = tokenizer.special_suffix();
      } catch (const Error& e) {
        fail("prepare: ", e.what(), " (--no-special-tokens prepares the text without them)");
      }
    }
    eos_in_suffix_ = !suffix_.empty() && suffix_.back() == eos_id;
    added_ = format ? 0 : static_cast<int64_t>(prefix_.size() + suffix_.size()) + (eos_in_suffix_ ? 0 : 1);
    if (!format && options.max_seq_len > 0)
      INGOT_CHECK(options.max_seq_len > added_, "prepare: max_seq_len ", options.max_seq_len, " leaves no room for text: every "
                  "document also takes ", counted(added_, "token"), " (the tokenizer's special tokens and the end-of-text token)");
  }

  void add(PendingDocument doc) {
    pending_bytes_ += static_cast<int64_t>(doc.text.size());
    pending_.push_back(std::move(doc));
    if (pending_.size() >= 1024 || pending_bytes_ >= (int64_t{8} << 20)) flush();
  }

  void flush() {
    if (pending_.empty()) return;
    std::vector<std::vector<int32_t>> ids = encode_all();
    // Taken out first: a failure part-way must not leave the finished documents to be sunk again.
    std::vector<PendingDocument> documents = std::move(pending_);
    pending_.clear();
    pending_bytes_ = 0;
    for (size_t i = 0; i < documents.size(); ++i) finish(documents[i], std::move(ids[i]));
  }

 private:
  std::vector<std::vector<int32_t>> encode_all() {
    std::vector<std::string_view> texts;
    for (const PendingDocument& d : pending_) texts.push_back(d.text);
    try {
      if (bpe_) return bpe_->encode_batch(texts, options_.num_threads);
      std::vector<std::vector<int32_t>> ids;
      for (std::string_view t : texts) ids.push_back(tokenizer_.encode(t));
      return ids;
    } catch (const Error&) {
      // Find the document at fault, one by one, to name it.
      for (const PendingDocument& d : pending_) {
        try {
          tokenizer_.encode(d.text);
        } catch (const Error& e) {
          if (const std::string at = invalid_utf8_position(d); !at.empty())
            fail("prepare: ", at, ": a tokenizer.json tokenizer reads UTF-8 text (the byte tokenizer takes any bytes)");
          fail("prepare: ", d.where, ": ", e.what());
        }
      }
      throw;
    }
  }

  void finish(PendingDocument& doc, std::vector<int32_t> ids) {
    std::vector<uint8_t> mask;
    const bool chat = format_ != nullptr;
    if (chat) {
      TokenizedChat out;
      if (!align_chat_mask(doc.chat, std::move(ids), *bpe_, options_.train_on_inputs, &out)) {
        try {
          out = tokenize_chat(*format_, *bpe_, doc.messages, options_.train_on_inputs);
        } catch (const Error& e) {
          // A record's own bytes the tokenizer drops, found once its batch is tokenized: skipped as
          // a bad line is. Any other failure to align is the tokenizer's, for every record alike.
          // Of the record's own text: the template's (a default system turn) is checked at load.
          const bool dropped_byte = std::any_of(doc.messages.begin(), doc.messages.end(), [&](const ChatMessage& m) {
            return bpe_->first_dropped_byte(m.content) >= 0 ||
                   (m.reasoning_content && bpe_->first_dropped_byte(*m.reasoning_content) >= 0);
          });
          if (!options_.skip_invalid_json || !dropped_byte)
            fail("prepare: ", doc.where, ": ", e.what(),
                 dropped_byte ? " (skip_invalid_json / --skip-invalid-json skips such lines)" : "");
          ++report_.skipped_json_lines;
          progress_.advance(doc.input_bytes);
          return;
        }
      }
      ids = std::move(out.tokens);
      mask = std::move(out.loss_mask);
    }
    progress_.advance(doc.input_bytes);
    // A text document is prefix + text + suffix (the tokenizer's special tokens, as `tokenizers`'
    // encode(text) adds them: transformers' run_clm trains Llama 3 on <|begin_of_text|> + text),
    // then the end-of-text token that separates documents, unless the suffix already ends with it.
    const int64_t limit = options_.max_seq_len;
    bool truncated = false;
    if (limit > 0 && static_cast<int64_t>(ids.size()) + added_ > limit) {
      if (options_.overflow == OverflowPolicy::drop) {
        ++report_.dropped;
        return;
      }
      // A text document keeps its special tokens and end-of-text token (in stream mode the only mark
      // between documents): the text is cut, as transformers' truncation cuts it. A chat sample is
      // cut as it comes.
      ids.resize(static_cast<size_t>(limit - added_));  // > 0 for text (the constructor checks)
      if (chat) mask.resize(limit);
      truncated = true;
    }
    if (!chat) {
      ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
      ids.insert(ids.end(), suffix_.begin(), suffix_.end());
      if (!eos_in_suffix_) ids.push_back(eos_id_);
    }
    const int64_t trained =
        chat ? std::count(mask.begin(), mask.end(), 1) : static_cast<int64_t>(ids.size());
    if (trained == 0) {
      ++report_.dropped_no_target;
      return;
    }
    sink_.add(ids, mask);
    report_.truncated += truncated;  // only what went into the shards: a dropped sample is "dropped"
    ++report_.num_documents;
    report_.num_tokens += static_cast<int64_t>(ids.size());
    report_.trained_tokens += trained;
  }

  const PrepareOptions& options_;
  const Tokenizer& tokenizer_;
  const int32_t eos_id_;  // ends each text document
  std::vector<int32_t> prefix_, suffix_;  // the tokenizer's special tokens around a text document
  bool eos_in_suffix_ = false;            // the suffix ends with the end-of-text token: none is added
  int64_t added_ = 0;                     // tokens a text document gets besides its text (0 for chat)
  const BpeTokenizer* bpe_;
  const ChatFormat* format_;
  ShardSink& sink_;
  PrepareReport& report_;
  Progress& progress_;
  std::vector<PendingDocument> pending_;
  int64_t pending_bytes_ = 0;
};

// "invalid JSON (...)" with nlohmann's reason, naming invalid UTF-8 as such (a number beyond a
// double's range is an out_of_range error, not a parse_error).
std::string describe_parse_error(const nlohmann::json::exception& e) {
  std::string what = e.what();
  if (const size_t at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
  if (what.find("UTF-8") != std::string::npos) return "invalid UTF-8 in a JSON string (" + what + ")";
  return "invalid JSON (" + what + ")";
}

}  // namespace

PrepareFormat parse_prepare_format(const std::string& name) {
  if (name == "text") return PrepareFormat::text;
  if (name == "chat") return PrepareFormat::chat;
  if (name == "alpaca") return PrepareFormat::alpaca;
  fail("prepare: format \"", name, "\" is not one of text, chat, alpaca (--format)");
}

OverflowPolicy parse_overflow_policy(const std::string& name) {
  if (name == "truncate") return OverflowPolicy::truncate;
  if (name == "drop") return OverflowPolicy::drop;
  fail("prepare: overflow \"", name, "\" is not one of truncate, drop (--overflow)");
}

std::string PrepareReport::to_string() const {
  std::ostringstream s;
  s << "prepare: " << counted(num_documents, "document") << ", " << counted(num_tokens, "token") << " from "
    << counted(num_files, "file") << " into " << counted(int64_t(shards.size()), "shard") << " in " << output_dir;
  if (!chat_format.empty()) {
    char pct[64];
    std::snprintf(pct, sizeof pct, "%.1f%%",
                  num_tokens ? 100.0 * static_cast<double>(trained_tokens) / num_tokens : 0.0);
    s << "\nprepare: chat format " << chat_format;
    if (!chat_date_string.empty()) s << " (Today Date: " << chat_date_string << ")";
    s << "; loss on " << counted(trained_tokens, "token") << " ("
      << pct << "), masked fraction ";
    std::snprintf(pct, sizeof pct, "%.1f%%",
                  num_tokens ? 100.0 * static_cast<double>(num_tokens - trained_tokens) / num_tokens
                             : 0.0);
    s << pct;
  }
  if (const int64_t maps = max_memory_maps(); maps > 0 && int64_t(shards.size()) > maps / 2)
    s << "\nprepare: warning: " << shards.size() << " shards; training maps each one, and this system allows "
      << maps << " memory maps a process (vm.max_map_count), which the program shares: use a larger --shard-tokens";
  s << "\nprepare: truncated " << truncated << ", dropped " << dropped
    << " (longer than max_seq_len)";
  if (dropped_no_target) s << ", dropped " << dropped_no_target << " with no assistant token";
  if (skipped_binary_files)
    s << "\nprepare: skipped " << counted(skipped_binary_files, "binary file")
      << " (the first: " << first_skipped_binary_file << ")";
  if (empty_files) s << "\nprepare: skipped " << counted(empty_files, "empty file");
  if (blank_documents) s << "\nprepare: skipped " << counted(blank_documents, "blank document") << " (whitespace only)";
  if (!repeated_inputs.empty())
    s << "\nprepare: read once: " << repeated_inputs.front()
      << (repeated_inputs.size() > 1 ? " and " + std::to_string(repeated_inputs.size() - 1) + " more" : std::string())
      << " named again (a file is read once however often it is named; to weight it, copy it)";
  if (skipped_json_lines)
    s << "\nprepare: skipped " << counted(skipped_json_lines, "invalid JSONL line");
  if (python_values_as_null)
    s << "\nprepare: read NaN, Infinity or numbers beyond a double's range as null on "
      << counted(python_values_as_null, "JSONL line") << " (Python's json writes them; JSON has none)";
  return s.str();
}

PrepareReport prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer) {
  // Ctrl-C or SIGTERM stops the prepare as a failure does, up to the moment its dataset moves in:
  // the staging folder (up to a whole dataset of partial shards) and the directories it created
  // go, and the output directory is left as it was. It used to die at once and leave them. The
  // handlers are installed before anything is created, and checked between documents and before
  // the commit; a signal during the commit (renames) lets it finish.
  static constexpr std::string_view kNote = ": stopping the prepare; nothing will be written (a second signal stops at once)";
  const StopSignals stop(kNote);
  auto check_stop = [&] {
    if (const int signal = stop.received())
      fail("prepare: stopped by ", signal_name(signal), "; nothing was written, and ", options.output_dir, " is as it was");
  };
  INGOT_CHECK(!options.output_dir.empty(), "prepare: no output directory given");
  INGOT_CHECK(options.shard_tokens > 0 && options.shard_tokens <= (int64_t{1} << 40),
              "prepare: shard_tokens must be between 1 and 2^40, got ", options.shard_tokens);
  INGOT_CHECK(options.num_threads >= 0 && options.num_threads <= 1024,
              "prepare: --threads must be between 0 (all cores) and 1024, got ", options.num_threads);
  INGOT_CHECK(options.max_seq_len >= 0, "prepare: --max-seq-len must be 0 (no limit) or more, got ",
              options.max_seq_len);
  INGOT_CHECK(tokenizer.vocab_size() > 0 && tokenizer.vocab_size() < (int64_t{1} << 32),
              "prepare: tokenizer vocab size ", tokenizer.vocab_size(), " is out of range");
  const bool chat = options.format != PrepareFormat::text;
  std::optional<ChatFormat> format;
  if (chat) {
    const char* name = options.format == PrepareFormat::chat ? "chat" : "alpaca";
    INGOT_CHECK(dynamic_cast<const BpeTokenizer*>(&tokenizer), "prepare: format ", name,
                " needs a tokenizer.json tokenizer with the chat format's special tokens "
                "(--tokenizer), not ",
                tokenizer.name());
    INGOT_CHECK(!options.chat_template.empty(), "prepare: format ", name,
                " needs the model's tokenizer_config.json for its chat template (--chat-template)");
    format = load_chat_format(options.chat_template, options.chat_format);
    if (!options.chat_date_string.empty())
      pin_chat_date(&*format, options.chat_date_string, "prepare", options.chat_template);
    const auto& bpe = static_cast<const BpeTokenizer&>(tokenizer);
    if (const std::string token = first_split_control_token(*format, bpe); !token.empty())
      fail("prepare: the chat template of ", options.chat_template, " (", format->name(), ") writes ", token,
           ", which tokenizer ", tokenizer.name(), " has no added token for (one encode() finds whole in text): it "
           "would be trained as plain text; use the tokenizer.json and tokenizer_config.json of the same model");
    if (const int byte = bpe.first_dropped_byte(format->default_system); byte >= 0)
      fail("prepare: the default system turn of the chat template of ", options.chat_template, " holds byte ",
           byte_hex(static_cast<uint8_t>(byte)), ", which the tokenizer drops (no token for it, no unk_token)");
  }
  int32_t eos_id = tokenizer.eos_id();
  if (!options.eos_token.empty()) {
    const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer);
    INGOT_CHECK(!chat, "prepare: eos_token applies to text documents; a chat format ends turns with its own tokens");
    INGOT_CHECK(bpe, "prepare: eos_token \"", options.eos_token, "\" needs a tokenizer.json tokenizer, not ", tokenizer.name());
    eos_id = bpe->token_to_id(options.eos_token);
    INGOT_CHECK(eos_id >= 0, "prepare: eos_token \"", options.eos_token, "\" is not a token of ", tokenizer.name());
    // An ordinary token (a word, a letter) at every document's end could not be told from the
    // text's own: the boundaries the loader packs and masks by would be invisible. The tokenizer's
    // own end-of-text token is taken whatever its flags, as it is without the flag.
    INGOT_CHECK(bpe->is_special(eos_id) || eos_id == tokenizer.eos_id(), "prepare: eos_token \"", options.eos_token, "\" is an ordinary token of ",
                tokenizer.name(), ", not one of its special tokens, so a document's end could not be told from text "
                "that holds it; give a special token", tokenizer.eos_id() >= 0 ? " (the tokenizer's own is \"" +
                bpe->id_to_token(tokenizer.eos_id()) + "\")" : std::string());
  }
  if (!chat)
    INGOT_CHECK(eos_id >= 0, "prepare: the tokenizer has no end-of-text token to separate documents (eos_token in "
                             "tokenizer_config.json, or --eos-token)");
  std::vector<std::string> repeated_inputs;
  std::vector<InputFile> files = collect_inputs(options, &repeated_inputs);
  for (InputFile& f : files) {
    // A file named on the command line is read whatever it holds, so a shard named there (an
    // --overwrite of its own dataset, say) became a dataset of its bytes.
    if (!f.from_directory && looks_like_shard(f.path.string()))
      fail("prepare: input ", f.path.string(), " is an Ingot token shard (it starts with \"INGOTTOK\"), not text: "
           "prepare the text it was made from, or give the shard to training as it is (train_data)");
    const bool named_json_lines = is_jsonl(f.path);
    f.json_lines = named_json_lines || (!chat && json_file_of_json_lines(f.path, options.text_field));
    if (f.json_lines && !named_json_lines && options.log)
      *options.log << "prepare: reading " << f.path.string() << " as JSON Lines (its first line is an object with a \""
                   << options.text_field << "\" string)\n";
  }
  // --text-field where no input is read as JSON Lines was ignored: docs.json (what datasets'
  // to_json names its JSON Lines) trained its raw JSON as text.
  if (!chat && options.text_field != "text" &&
      std::none_of(files.begin(), files.end(), reads_as_json_lines))
    fail("prepare: --text-field ", options.text_field, " applies to JSON Lines inputs (*.jsonl, *.ndjson, or *.json whose "
         "first line is an object with that field), and none of the inputs is one (",
         files.empty() ? std::string("none found") : files.front().path.string(), files.size() > 1 ? " and others" : "",
         " would be read as plain text); name JSON Lines files .jsonl");
  // A separator line is matched against plain-text files only, one line at a time.
  if (!options.doc_separator.empty()) {
    INGOT_CHECK(options.doc_separator.find_first_of("\r\n") == std::string::npos, "prepare: --doc-separator \"",
                options.doc_separator, "\" holds a line break, and is matched against one line at a time: it could "
                "never match; give the separator line itself");
    if (!files.empty() && std::all_of(files.begin(), files.end(), reads_as_json_lines))
      fail("prepare: --doc-separator applies to plain-text inputs, and every input is JSON Lines (",
           files.front().path.string(), files.size() > 1 ? " and others" : "",
           "), where each line is a document; leave it out");
  }
  const CreatedOutputDir created_output{options.output_dir, check_output(options, files)};
  StagingDir staging(options.output_dir);
  PrepareOptions staged = options;  // every file is written into the staging folder
  staged.output_dir = staging.path.string();

  PrepareReport report;
  report.output_dir = options.output_dir;
  report.repeated_inputs = repeated_inputs;
  if (format) report.chat_format = format->name(), report.chat_date_string = format->date_string;
  int64_t total_bytes = 0;
  for (const InputFile& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f.path, ec);
    if (!ec) total_bytes += static_cast<int64_t>(size);
  }
  Progress progress(options.log, options.progress_tty, total_bytes);
  ShardSink sink(staged, tokenizer, report, chat);
  DocumentEncoder encoder(options, tokenizer, eos_id, format ? &*format : nullptr, sink, report, progress);
  // first_line: a plain-text file's document, the line of `file` it starts on; 0 for a record.
  auto add_text = [&](std::string where, std::string_view text, int64_t bytes, const std::string& file = "",
                      int64_t first_line = 0) {
    check_stop();
    PendingDocument doc;  // member by member: from the aggregate form GCC 12 warned that chat may be used uninitialised
    doc.where = std::move(where);
    doc.text = std::string(text);
    doc.input_bytes = bytes;
    doc.file = file;
    doc.first_line = first_line;
    encoder.add(std::move(doc));
  };

  try {
    for (const InputFile& input : files) {
      check_stop();
      const std::string name = input.path.string();
      std::error_code size_ec;
      if (fs::file_size(input.path, size_ec) == 0 && !size_ec) {
        INGOT_CHECK(input.from_directory, "prepare: input ", name, " is empty");
        ++report.empty_files;
        continue;
      }
      // Chat and alpaca read every file as JSON Lines, but pass over a binary one found in a
      // directory (an earlier dataset's shards) as text does; it was read as invalid JSON.
      if (chat && input.from_directory && !is_jsonl(input.path) && starts_binary(input.path)) {
        if (report.skipped_binary_files++ == 0) report.first_skipped_binary_file = name;
        std::error_code ec;
        const uintmax_t bytes = fs::file_size(input.path, ec);
        progress.advance(ec ? 0 : static_cast<int64_t>(bytes));
        continue;
      }
      if (chat || input.json_lines) {
        std::ifstream in(input.path, std::ios::binary);
        if (!in) fail("prepare: cannot open ", name, ": ", std::strerror(errno));
        LineReader lines(in);
        std::string line;
        int64_t records = 0, line_bytes = 0;
        for (int64_t line_number = 1; lines.next(line, line_bytes); ++line_number) {
          check_stop();
          // A byte-order mark before nothing (an editor's BOM on an empty first line) is a blank line.
          if (is_blank(std::string_view(line).substr(line.starts_with(kUtf8Bom) ? 3 : 0))) {
            progress.advance(line_bytes);
            continue;
          }
          ++records;
          const std::string where = name + ":" + std::to_string(line_number);
          std::string problem;
          nlohmann::json record;
          std::optional<PendingDocument> chat_document;
          // The parser stops at a NUL byte as at the end of the input: what followed one was
          // dropped without a word. JSON has no raw NUL, in a string or outside one.
          if (const size_t nul = line.find('\0'); nul != std::string::npos) {
            problem = "invalid JSON (a NUL byte at column " + std::to_string(nul + 1) + ")";
          } else {
            try {
              record = nlohmann::json::parse(line);
            } catch (const nlohmann::json::exception& e) {
              problem = describe_parse_error(e);
              if (std::optional<nlohmann::json> python = parse_python_json_line(line))
                record = std::move(*python), problem.clear(), ++report.python_values_as_null;
            }
          }
          if (!problem.empty()) {
            // reported below
          } else if (!record.is_object()) {
            problem = "not a JSON object";
          } else if (!chat) {
            auto field = record.find(options.text_field);
            if (field == record.end() || !field->is_string())
              problem = "no string field \"" + options.text_field + "\"" +
                        (record.contains("messages") ? std::string(" (chat data: --format chat)")
                         : record.contains("instruction") ? std::string(" (alpaca data: --format alpaca)")
                                                          : std::string());
            else if (const auto& text = field->get_ref<const std::string&>(); !is_blank_document(text))
              add_text(where, text, line_bytes);
            else
              ++report.blank_documents, progress.advance(line_bytes);
          } else {
            try {
              PendingDocument doc;
              doc.where = where;
              doc.input_bytes = line_bytes;
              if (options.format == PrepareFormat::chat) {
                const auto field = record.find(options.messages_field);
                if (field == record.end())
                  fail("no \"", options.messages_field, "\" field (chat records hold a list of ",
                       "{role, content} messages; --format alpaca reads instruction/input/output)");
                doc.messages = chat_messages_from_json(*field);
              } else {
                doc.messages = alpaca_messages_from_json(record);
              }
              doc.chat = render_chat(*format, doc.messages);
              doc.text = doc.chat.text;
              chat_document = std::move(doc);
            } catch (const Error& e) {
              problem = e.what();
            }
          }
          // Added outside the try above: adding can finish earlier records, whose errors name them.
          if (chat_document) encoder.add(std::move(*chat_document));
          if (problem.empty()) continue;
          if (!options.skip_invalid_json)
            fail("prepare: ", where, ": ", problem,
                 " (skip_invalid_json / --skip-invalid-json skips such lines)");
          ++report.skipped_json_lines;
          progress.advance(line_bytes);
        }
        if (in.bad()) fail("prepare: cannot read ", name);
        if (records == 0) {
          INGOT_CHECK(input.from_directory, "prepare: input ", name,
                      " holds no JSONL records (only blank lines)");
          ++report.empty_files;
          continue;
        }
        ++report.num_files;
        continue;
      }

      std::string content = read_file(input.path);
      // A UTF-8 byte-order mark marks the encoding, not text: it would start the first document,
      // and hide a separator on the first line.
      if (content.starts_with(kUtf8Bom)) content.erase(0, 3);
      if (input.from_directory && content.find('\0') != std::string::npos) {
        if (report.skipped_binary_files++ == 0) report.first_skipped_binary_file = name;
        progress.advance(static_cast<int64_t>(content.size()));
        continue;
      }
      ++report.num_files;
      if (options.doc_separator.empty()) {
        if (!is_blank_document(content))
          add_text(name, content, static_cast<int64_t>(content.size()), name, 1);
        else
          ++report.blank_documents, progress.advance(static_cast<int64_t>(content.size()));
        continue;
      }
      // Lines equal to the separator end a document; they are not part of it. A line ends at "\n",
      // "\r\n" or a lone "\r", as LineReader's do.
      std::string_view rest(content);
      size_t doc_begin = 0, line_begin = 0;
      int64_t line_number = 1, doc_line = 1;
      auto emit = [&](std::string_view doc, size_t consumed_to) {
        const int64_t bytes = static_cast<int64_t>(consumed_to) - static_cast<int64_t>(doc_begin);
        if (!is_blank_document(doc))
          add_text(name + ":" + std::to_string(doc_line), doc, bytes, name, doc_line);
        else if (!doc.empty())
          ++report.blank_documents, progress.advance(bytes);  // nothing between two separators is no document
        else
          progress.advance(bytes);
      };
      while (line_begin < content.size()) {
        const size_t line_end = std::min(content.find_first_of("\r\n", line_begin), content.size());
        const size_t next = line_end + line_break_length(rest, line_end);
        const std::string_view line = rest.substr(line_begin, line_end - line_begin);
        ++line_number;
        if (line == options.doc_separator) {
          emit(rest.substr(doc_begin, line_begin - doc_begin), next);
          doc_begin = next;
          doc_line = line_number;
        }
        line_begin = next;
      }
      emit(rest.substr(doc_begin), content.size());
    }
    encoder.flush();
    sink.close();
    check_stop();
  } catch (...) {
    // The partial dataset goes with the staging folder; the output directory is untouched.
    sink.abandon();
    throw;
  }
  progress.finish();

  if (report.num_documents == 0) {
    std::ostringstream inputs;
    for (size_t i = 0; i < options.inputs.size(); ++i)
      inputs << (i ? ", " : "") << options.inputs[i];
    fail("prepare: no documents found in ", inputs.str(), " (", counted(int64_t(files.size()), "file"), ": ",
         report.empty_files, " empty, ", report.skipped_binary_files, " skipped as binary; ",
         counted(report.blank_documents, "blank document"), " (whitespace only) and ",
         counted(report.skipped_json_lines, "invalid JSONL line"), " skipped, ",
         counted(report.dropped + report.dropped_no_target, "document"), " dropped)");
  }

  const bool with_special_tokens = !chat && options.add_special_tokens;
  const std::vector<int32_t> prefix = with_special_tokens ? tokenizer.special_prefix() : std::vector<int32_t>{},
                             suffix = with_special_tokens ? tokenizer.special_suffix() : std::vector<int32_t>{};
  nlohmann::json meta = {
      {"format", "ingot-token-shards"},
      {"format_version", kShardVersion},
      {"tokenizer", tokenizer.name()},
      {"vocab_size", tokenizer.vocab_size()},
      {"eos_id", eos_id},
      {"special_tokens", chat ? nlohmann::json(nullptr) : nlohmann::json{{"prefix", prefix}, {"suffix", suffix}}},
      {"token_width", shard_token_width_for_vocab(tokenizer.vocab_size())},
      {"num_tokens", report.num_tokens},
      {"num_documents", report.num_documents},
      {"num_files", report.num_files},
      {"input_format", options.format == PrepareFormat::text   ? "text"
                       : options.format == PrepareFormat::chat ? "chat"
                                                               : "alpaca"},
      {"loss_mask", chat},
      {"trained_tokens", report.trained_tokens},
      {"max_seq_len", options.max_seq_len},
      {"overflow", options.overflow == OverflowPolicy::drop ? "drop" : "truncate"},
      {"truncated", report.truncated},
      {"dropped", report.dropped},
      {"dropped_no_target", report.dropped_no_target},
      {"shards", nlohmann::json::array()},
  };
  if (chat) {
    meta["chat_format"] = report.chat_format;
    // false: an unchecked template rendered with --chat-format, as its user chose.
    meta["chat_template_checked"] = format && format->checked;
    if (!report.chat_date_string.empty()) meta["chat_date_string"] = report.chat_date_string;
    meta["train_on_inputs"] = options.train_on_inputs;
  }
  for (const PreparedShard& shard : report.shards)
    meta["shards"].push_back({{"file", shard.file},
                              {"num_tokens", shard.num_tokens},
                              {"num_documents", shard.num_documents}});
  // Beside the shards, so that training runs and checkpoints carry the tokenizer; meta.json lists
  // them as the dataset's own. An identical file already there that is not a dataset's (the user's:
  // check_output compared them) is left in place, and not listed, so no later prepare moves it.
  const std::set<std::string> earlier = dataset_tokenizer_files(options.output_dir);
  meta["tokenizer_files"] = nlohmann::json::array();
  for (const auto& [src, name] : tokenizer_files_to_copy(options)) {
    if (fs::exists(fs::path(options.output_dir) / name) && !earlier.contains(name)) continue;
    fs::copy_file(src, staging.path / name);
    meta["tokenizer_files"].push_back(name);
  }
  io::write_file_atomically((staging.path / "meta.json").string(), meta.dump(2) + "\n");
  check_stop();
  staging.commit(options.output_dir, options.overwrite, options.log);
  if (options.log) *options.log << report.to_string() << "\n";
  return report;
}

}  // namespace ingot::data
