#include "ingot/data/prepare.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "ingot/core/error.h"
#include "ingot/data/shard.h"

namespace ingot::data {

namespace fs = std::filesystem;

namespace {

struct InputFile {
  fs::path path;
  bool from_directory;  // found by walking a directory (binary files are skipped, not read)
};

bool is_hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

bool is_jsonl(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".jsonl" || ext == ".ndjson";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("prepare: cannot open ", path.string(), ": ", std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) fail("prepare: cannot read ", path.string());
  return std::move(s).str();
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isspace(static_cast<unsigned char>(c)); });
}

// Inputs expanded to files in a deterministic order, each real file once.
std::vector<InputFile> collect_inputs(const PrepareOptions& options) {
  INGOT_CHECK(!options.inputs.empty(), "prepare: no inputs given");
  std::error_code ec;
  const fs::path output = fs::weakly_canonical(options.output_dir, ec);
  std::vector<InputFile> files;
  std::set<fs::path> seen;
  auto add = [&](const fs::path& p, bool from_directory) {
    const fs::path canonical = fs::weakly_canonical(p, ec);
    if (!seen.insert(ec ? p : canonical).second) return;
    files.push_back({p, from_directory});
  };
  for (const std::string& input : options.inputs) {
    const fs::path root(input);
    if (fs::is_directory(root, ec)) {
      std::vector<fs::path> found;
      auto it =
          fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied);
      for (; it != fs::recursive_directory_iterator(); ++it) {
        const fs::path& p = it->path();
        if (is_hidden(p) || fs::weakly_canonical(p, ec) == output) {
          if (it->is_directory(ec)) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(ec)) found.push_back(p);
      }
      std::sort(found.begin(), found.end());
      for (const fs::path& p : found) add(p, true);
    } else if (fs::is_regular_file(root, ec)) {
      add(root, false);
    } else {
      fail("prepare: input ", input, " is not a file or directory");
    }
  }
  return files;
}

// Splits documents across shards of at most shard_tokens tokens, naming them train-NNNNN.bin.
class ShardSink {
 public:
  ShardSink(const PrepareOptions& options, const Tokenizer& tokenizer, PrepareReport& report)
      : options_(options),
        report_(report),
        vocab_size_(static_cast<uint32_t>(tokenizer.vocab_size())),
        width_(shard_token_width_for_vocab(tokenizer.vocab_size())) {}

  void add(std::span<const int32_t> tokens) {
    while (!tokens.empty()) {
      if (!writer_) open();
      const int64_t space = options_.shard_tokens - writer_->num_tokens();
      if (static_cast<int64_t>(tokens.size()) <= space) {
        writer_->add_document(tokens);
        return;
      }
      if (writer_->num_tokens() > 0) {  // does not fit: start a fresh shard
        close();
        continue;
      }
      writer_->add_document(tokens.first(space));  // longer than a whole shard: split it
      tokens = tokens.subspan(space);
      close();
    }
  }

  void close() {
    if (!writer_) return;
    writer_->finish();
    report_.shards.push_back({fs::path(writer_->path()).filename().string(), writer_->num_tokens(),
                              writer_->num_documents()});
    if (options_.log)
      *options_.log << "prepare: wrote " << writer_->path() << " (" << writer_->num_tokens()
                    << " tokens, " << writer_->num_documents() << " documents)\n";
    writer_.reset();
  }

  // Drops the shard in progress (its writer removes the .tmp file).
  void abandon() { writer_.reset(); }

 private:
  void open() {
    char name[32];
    std::snprintf(name, sizeof name, "train-%05zu.bin", report_.shards.size());
    writer_ = std::make_unique<ShardWriter>((fs::path(options_.output_dir) / name).string(), width_,
                                            vocab_size_, false);
  }

  const PrepareOptions& options_;
  PrepareReport& report_;
  uint32_t vocab_size_, width_;
  std::unique_ptr<ShardWriter> writer_;
};

// Removes the shards and meta.json of an earlier run, or refuses to when overwrite is off.
void clear_output(const PrepareOptions& options) {
  const fs::path dir(options.output_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("prepare: cannot create output directory ", dir.string(), ": ", ec.message());
  std::vector<fs::path> old;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == "meta.json" || name == "meta.json.tmp" ||
        (name.rfind("train-", 0) == 0 && (name.ends_with(".bin") || name.ends_with(".bin.tmp"))))
      old.push_back(entry.path());
  }
  if (old.empty()) return;
  INGOT_CHECK(options.overwrite, "prepare: output directory ", dir.string(), " already holds ",
              old.front().filename().string(), " (", old.size(),
              " dataset files); choose another directory or set overwrite (--overwrite)");
  for (const fs::path& p : old) fs::remove(p);
}

}  // namespace

std::string PrepareReport::to_string() const {
  std::ostringstream s;
  s << "prepare: " << num_documents << " documents, " << num_tokens << " tokens from " << num_files
    << " files into " << shards.size() << " shard(s) in " << output_dir;
  if (skipped_binary_files)
    s << "\nprepare: skipped " << skipped_binary_files
      << " binary files (the first: " << first_skipped_binary_file << ")";
  if (skipped_json_lines)
    s << "\nprepare: skipped " << skipped_json_lines << " invalid JSONL lines";
  return s.str();
}

PrepareReport prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer) {
  INGOT_CHECK(!options.output_dir.empty(), "prepare: no output directory given");
  INGOT_CHECK(options.shard_tokens > 0, "prepare: shard_tokens must be positive, got ",
              options.shard_tokens);
  INGOT_CHECK(tokenizer.vocab_size() > 0 && tokenizer.vocab_size() < (int64_t{1} << 32),
              "prepare: tokenizer vocab size ", tokenizer.vocab_size(), " is out of range");
  const std::vector<InputFile> files = collect_inputs(options);
  clear_output(options);

  PrepareReport report;
  report.output_dir = options.output_dir;
  ShardSink sink(options, tokenizer, report);
  std::vector<int32_t> tokens;
  auto add_document = [&](std::string_view text) {
    tokens = tokenizer.encode(text);
    tokens.push_back(tokenizer.eos_id());
    sink.add(tokens);
    ++report.num_documents;
    report.num_tokens += static_cast<int64_t>(tokens.size());
  };

  try {
    for (const InputFile& input : files) {
      const std::string name = input.path.string();
      if (is_jsonl(input.path)) {
        std::ifstream in(input.path, std::ios::binary);
        if (!in) fail("prepare: cannot open ", name, ": ", std::strerror(errno));
        std::string line;
        for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
          if (is_blank(line)) continue;
          std::string problem;
          nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
          if (record.is_discarded()) {
            problem = "invalid JSON";
          } else if (!record.is_object()) {
            problem = "not a JSON object";
          } else {
            auto field = record.find(options.text_field);
            if (field == record.end() || !field->is_string())
              problem = "no string field \"" + options.text_field + "\"";
            else if (const auto& text = field->get_ref<const std::string&>(); !text.empty())
              add_document(text);
          }
          if (problem.empty()) continue;
          if (!options.skip_invalid_json)
            fail("prepare: ", name, ":", line_number, ": ", problem,
                 " (skip_invalid_json / --skip-invalid-json skips such lines)");
          ++report.skipped_json_lines;
        }
        if (in.bad()) fail("prepare: cannot read ", name);
        ++report.num_files;
        continue;
      }

      const std::string content = read_file(input.path);
      if (input.from_directory && content.find('\0') != std::string::npos) {
        if (report.skipped_binary_files++ == 0) report.first_skipped_binary_file = name;
        continue;
      }
      ++report.num_files;
      if (options.doc_separator.empty()) {
        if (!is_blank(content)) add_document(content);
        continue;
      }
      // Lines equal to the separator (ignoring a trailing \r) end a document; they are not part of
      // it.
      std::string_view rest(content);
      size_t doc_begin = 0, line_begin = 0;
      while (line_begin < content.size()) {
        size_t line_end = content.find('\n', line_begin);
        const size_t next = line_end == std::string::npos ? content.size() : line_end + 1;
        if (line_end == std::string::npos) line_end = content.size();
        std::string_view line = rest.substr(line_begin, line_end - line_begin);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line == options.doc_separator) {
          const std::string_view doc = rest.substr(doc_begin, line_begin - doc_begin);
          if (!is_blank(doc)) add_document(doc);
          doc_begin = next;
        }
        line_begin = next;
      }
      const std::string_view tail = rest.substr(doc_begin);
      if (!is_blank(tail)) add_document(tail);
    }
    sink.close();
  } catch (...) {
    // Leave no partial dataset behind: a loader pointed at the directory would read it silently.
    sink.abandon();
    for (const PreparedShard& shard : report.shards)
      fs::remove(fs::path(options.output_dir) / shard.file);
    throw;
  }

  if (report.num_documents == 0) {
    std::ostringstream inputs;
    for (size_t i = 0; i < options.inputs.size(); ++i)
      inputs << (i ? ", " : "") << options.inputs[i];
    fail("prepare: no documents found in ", inputs.str(), " (", files.size(), " files, ",
         report.skipped_binary_files, " skipped as binary, ", report.skipped_json_lines,
         " invalid JSONL lines skipped)");
  }

  nlohmann::json meta = {
      {"format", "ingot-token-shards"},
      {"format_version", kShardVersion},
      {"tokenizer", tokenizer.name()},
      {"vocab_size", tokenizer.vocab_size()},
      {"eos_id", tokenizer.eos_id()},
      {"token_width", shard_token_width_for_vocab(tokenizer.vocab_size())},
      {"num_tokens", report.num_tokens},
      {"num_documents", report.num_documents},
      {"num_files", report.num_files},
      {"shards", nlohmann::json::array()},
  };
  for (const PreparedShard& shard : report.shards)
    meta["shards"].push_back({{"file", shard.file},
                              {"num_tokens", shard.num_tokens},
                              {"num_documents", shard.num_documents}});
  const fs::path meta_path = fs::path(options.output_dir) / "meta.json";
  const fs::path meta_temp = fs::path(options.output_dir) / "meta.json.tmp";
  {
    std::ofstream out(meta_temp, std::ios::binary);
    out << meta.dump(2) << "\n";
    out.close();
    if (!out) fail("prepare: cannot write ", meta_temp.string());
  }
  std::error_code ec;
  fs::rename(meta_temp, meta_path, ec);
  if (ec)
    fail("prepare: cannot rename ", meta_temp.string(), " to ", meta_path.string(), ": ",
         ec.message());
  if (options.log) *options.log << report.to_string() << "\n";
  return report;
}

}  // namespace ingot::data
