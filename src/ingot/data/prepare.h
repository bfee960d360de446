// prepare: text corpora -> token shards (the library behind `ingot prepare`).
//
// Inputs are files or directories (walked recursively, sorted by path, hidden entries skipped).
//   *.jsonl, *.ndjson  one JSON object per line; the string field `text_field` is one document.
//                      Blank lines are ignored; a line that is not valid JSON, or lacks the field,
//                      is an error naming FILE:LINE (or is skipped and counted, skip_invalid_json).
//   anything else      plain text, passed to the tokenizer byte for byte (no UTF-8 check). One
//                      document per file, or, with doc_separator set, documents separated by lines
//                      equal to it (fortune files: "%"). Whitespace-only documents are dropped.
// Files found by walking a directory that hold a NUL byte are taken for binary (e.g. fortune's
// .dat indexes) and skipped; a file reached twice (a symlink) is read once.
// Every document is encoded and followed by tokenizer.eos_id(). Documents fill shards
// OUTPUT/train-00000.bin, ... of at most shard_tokens tokens; a document that does not fit starts a
// new shard, and only a document longer than shard_tokens is split across shards. Finally
// OUTPUT/meta.json records the tokenizer and the counts. Every file is written as NAME.tmp and
// renamed into place.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "ingot/data/tokenizer.h"

namespace ingot::data {

struct PrepareOptions {
  std::vector<std::string> inputs;     // files and/or directories
  std::string output_dir;              // created if missing
  int64_t shard_tokens = 100'000'000;  // at most this many tokens per shard
  std::string doc_separator;        // plain text: separator line (e.g. "%"); empty: file = document
  std::string text_field = "text";  // JSONL: field holding the document text
  bool skip_invalid_json = false;   // JSONL: skip and count bad lines instead of failing
  bool overwrite = false;           // replace train-*.bin and meta.json already in output_dir
  std::ostream* log = nullptr;      // progress lines and the final report; null: silent
};

struct PreparedShard {
  std::string file;  // name inside output_dir, e.g. "train-00000.bin"
  int64_t num_tokens = 0;
  int64_t num_documents = 0;  // document starts in this shard (a split document counts in each)
};

struct PrepareReport {
  int64_t num_files = 0;             // input files read
  int64_t num_documents = 0;         // documents encoded
  int64_t num_tokens = 0;            // tokens written, separators included
  int64_t skipped_binary_files = 0;  // found in a directory and holding a NUL byte
  std::string first_skipped_binary_file;
  int64_t skipped_json_lines = 0;  // only with skip_invalid_json
  std::vector<PreparedShard> shards;
  std::string output_dir;
  std::string to_string() const;  // the final report, a few lines
};

// Throws ingot::Error (naming the file, or FILE:LINE for JSONL) on unreadable or malformed input,
// on an input with no documents, and when output_dir already holds shards and overwrite is off.
PrepareReport prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer);

}  // namespace ingot::data
