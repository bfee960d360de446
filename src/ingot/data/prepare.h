// prepare: text corpora and chat data -> token shards (the library behind `ingot prepare`).
//
// Inputs are files or directories (walked recursively, sorted by path, hidden entries skipped).
// format text (pretraining):
//   *.jsonl, *.ndjson  one JSON object per line; the string field `text_field` is one document.
//                      Blank lines are ignored; a line that is not valid JSON, or lacks the field,
//                      is an error naming FILE:LINE (or is skipped and counted, skip_invalid_json).
//   anything else      plain text, passed to the tokenizer byte for byte (no UTF-8 check by the
//                      byte tokenizer; a BPE tokenizer rejects invalid UTF-8: FILE:LINE). One
//                      document per file, or, with doc_separator set, documents separated by lines
//                      equal to it (fortune files: "%"). Whitespace-only documents are dropped.
//   Every document is encoded, put between the tokenizer's special_prefix() and special_suffix()
//   (add_special_tokens) and followed by its end-of-text token (unless the suffix ends with it);
//   shards have no loss mask.
// format chat / alpaca (SFT): every input file is JSON Lines, one sample per record:
//   chat    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//   alpaca  {"instruction": ..., "input": ... (optional), "output": ..., "system": ... (optional)}
//   rendered with the chat format of `chat_template` (chat_format.h) into one document each, with a
//   loss mask (assistant tokens, or all with train_on_inputs). Bad records (invalid JSON or UTF-8,
//   missing fields, unknown roles) are errors naming FILE:LINE, or skipped and counted with
//   skip_invalid_json. A sample whose mask is all 0 (no assistant turn left) is dropped.
// Any format: a document longer than max_seq_len (> 0) tokens is truncated to max_seq_len tokens
// or dropped (overflow), and counted; a text document's text is cut, its special tokens and
// end-of-text token kept (a max_seq_len with no room for text is refused). An input file named on the command line
// that is empty is an error; an empty file found in a directory is skipped and counted.
// Files found by walking a directory that hold a NUL byte are taken for binary (e.g. fortune's
// .dat indexes) and skipped; a file reached twice (a symlink) is read once.
// Documents fill shards OUTPUT/train-00000.bin, ... of at most shard_tokens tokens; a document that
// does not fit starts a new shard, and only a document longer than shard_tokens is split across
// shards. Finally OUTPUT/meta.json records the tokenizer, the options and the counts. The whole
// dataset (shards, tokenizer files, meta.json) is built in a hidden staging folder inside OUTPUT
// and moved into place once complete; --overwrite replaces an earlier dataset's shards, meta.json
// and the tokenizer files its meta.json lists. With a log stream, a progress line (percent of
// input bytes, MB/s, ETA) is written at most every 0.5 s, then the final report.
#pragma once
#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "ingot/data/tokenizer.h"

namespace ingot::data {

// The tokenizer files `ingot prepare` copies beside the shards it writes (tokenizer.json first),
// for training runs and checkpoints to carry; an input directory holding such a dataset skips them.
inline constexpr std::array<const char*, 3> kTokenizerFilesBesideShards = {"tokenizer.json", "tokenizer_config.json",
                                                                           "chat_template.jinja"};
inline bool is_tokenizer_file_name(std::string_view name) {
  for (const char* file : kTokenizerFilesBesideShards)
    if (name == file) return true;
  return false;
}

enum class PrepareFormat { text, chat, alpaca };
PrepareFormat parse_prepare_format(const std::string& name);  // "text" | "chat" | "alpaca"
enum class OverflowPolicy { truncate, drop };
OverflowPolicy parse_overflow_policy(const std::string& name);  // "truncate" | "drop"

struct PrepareOptions {
  PrepareFormat format = PrepareFormat::text;
  std::string chat_template;          // chat / alpaca: tokenizer_config.json (or its folder)
  std::string chat_format;            // chat / alpaca: a built-in format for an unchecked template ("": none)
  std::string chat_date_string;       // chat / alpaca, llama3.1: "Today Date: " text ("": the template's)
  std::string messages_field = "messages";  // chat: the field holding the conversation
  bool train_on_inputs = false;       // chat / alpaca: loss on every token, not only the assistant's
  int64_t max_seq_len = 0;            // > 0: longest document kept whole (tokens)
  OverflowPolicy overflow = OverflowPolicy::truncate;
  int num_threads = 0;                // BPE encoding threads (0: all cores; at most 1024)
  bool progress_tty = false;          // progress redraws one line with \r instead of new lines
  std::vector<std::string> inputs;     // files and/or directories
  std::string output_dir;              // created if missing
  int64_t shard_tokens = 100'000'000;  // at most this many tokens per shard
  std::string doc_separator;        // plain text: separator line (e.g. "%"); empty: file = document
  // Text documents: the token that ends each (e.g. "<|endoftext|>" with an instruct model's
  // tokenizer, whose eos_token is its end of turn); empty: the tokenizer's eos_token.
  std::string eos_token;
  std::string text_field = "text";  // JSONL: field holding the document text
  // Text documents: the tokenizer's special tokens around each (Tokenizer::special_prefix(), as
  // `tokenizers`' encode(text) adds them: Llama 3's <|begin_of_text|>); false: none.
  bool add_special_tokens = true;
  bool skip_invalid_json = false;   // JSONL: skip and count bad lines instead of failing
  bool overwrite = false;           // replace the dataset already in output_dir (its shards, meta.json, tokenizer files)
  // The tokenizer.json the shards were encoded with (empty: byte-level). It and the
  // tokenizer_config.json and chat_template.jinja beside it are copied into the dataset, so that
  // training runs and checkpoints carry them (kTokenizerFilesBesideShards).
  std::string tokenizer_file;
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
  int64_t skipped_json_lines = 0;  // invalid lines / records, only with skip_invalid_json
  int64_t python_values_as_null = 0;  // JSONL lines whose NaN, Infinity or out-of-range numbers read as null
  int64_t empty_files = 0;         // found in a directory and empty (skipped)
  int64_t blank_documents = 0;     // documents of whitespace only (JSONL text fields, separated docs, files): skipped
  std::vector<std::string> repeated_inputs;  // files named on the command line more than once (read once)
  int64_t trained_tokens = 0;      // tokens whose loss-mask byte is 1 (= num_tokens without a mask)
  int64_t truncated = 0;           // documents cut to max_seq_len
  int64_t dropped = 0;             // documents dropped: longer than max_seq_len with overflow drop
  int64_t dropped_no_target = 0;   // chat / alpaca samples with no trained token
  std::string chat_format;         // chat / alpaca: the format used (e.g. "chatml-qwen3")
  std::string chat_date_string;    // llama3.1: the date its system turns give ("" for other formats)
  std::vector<PreparedShard> shards;
  std::string output_dir;
  std::string to_string() const;  // the final report, a few lines
};

// Throws ingot::Error (naming the file, or FILE:LINE for JSONL) on unreadable or malformed input,
// on an input with no documents, and when output_dir already holds shards and overwrite is off.
PrepareReport prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer);

// What a prepare's staging folder (.prepare-<pid> in an output directory) holds when that prepare
// was killed (or is still running), as far as training on the output directory is concerned:
//   holds_set_aside_dataset: the old dataset, set aside mid-swap in a non-empty old/; an empty old/
//     (versions before 2026-12-02 made it first) holds nothing;
//   holds_staged_dataset: the new dataset's meta.json, which prepare writes last and moves in last,
//     so the move-in of its shards may have stopped part way.
// Either way the output directory's shards may be partial or mixed, and training on it is refused.
bool holds_set_aside_dataset(const std::string& staging_folder);
bool holds_staged_dataset(const std::string& staging_folder);

}  // namespace ingot::data
