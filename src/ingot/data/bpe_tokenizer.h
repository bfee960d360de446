// BpeTokenizer: a Hugging Face tokenizer.json byte-level BPE tokenizer (GPT-2, Llama 3,
// Qwen2/2.5/3).
//
// Pipeline of encode(text), the same as `tokenizers`' Tokenizer::encode(text,
// add_special_tokens=false):
//   1. added tokens (special and not) with normalized=false are matched in the raw text, leftmost
//      then longest, honouring lstrip / rstrip / single_word; their ids are emitted directly;
//   2. each remaining segment is normalized (none or NFC), then added tokens with normalized=true
//      are matched in it the same way;
//   3. pre-tokenizer: Split(Regex, Isolated) and/or ByteLevel(use_regex: GPT-2 pattern), via PCRE2
//      (UTF + UCP + JIT);
//   4. each pre-token's bytes go through ranked BPE merges (lowest rank first, leftmost on ties);
//      with ignore_merges a pre-token that is itself in the vocab is taken whole.
// The post-processor is not applied by encode(); special_prefix() / special_suffix() give what its
// TemplateProcessing puts around a single text (Llama 3: <|begin_of_text|> before it).
// Any component other than these is rejected at load with an ingot::Error naming the file, the
// component and its value. Immutable after from_file(); encode is safe from many threads.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ingot/data/tokenizer.h"

namespace ingot::data {

struct BpeTokenizerImpl;

class BpeTokenizer : public Tokenizer {
 public:
  // Reads `path` (a tokenizer.json, or a folder holding one). eos_id() comes from the eos_token
  // of tokenizer_config.json in the same folder when that file exists, else it is -1.
  static BpeTokenizer from_file(const std::string& path);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer() override;

  // Throws ingot::Error on invalid UTF-8 (naming the byte offset).
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  int32_t eos_id() const override;
  std::string name() const override;
  // Throw ingot::Error naming a post_processor other than ByteLevel / TemplateProcessing / Sequence.
  std::vector<int32_t> special_prefix() const override;
  std::vector<int32_t> special_suffix() const override;

  // Invalid UTF-8 in the decoded bytes becomes U+FFFD, as in `tokenizers`.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  // Encodes documents on `num_threads` threads (<= 0: hardware concurrency). Output i is
  // encode(texts[i]); the result does not depend on the thread count.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& texts,
                                                 int num_threads) const;

  // Id of a vocab or added token given its tokenizer.json string (byte-level form, e.g. "Ġthe"),
  // or -1.
  int32_t token_to_id(std::string_view token) const;
  // The tokenizer.json string of an id; throws ingot::Error outside [0, vocab_size()).
  const std::string& id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // The text an added token (special or not) stands for where encode() found it: its content,
  // NFC'd for a normalized one under an NFC normalizer; null for a vocab token.
  const std::string* added_token_text(int32_t id) const;
  // Bytes encode() drops, as `tokenizers` does: those with no single-byte token, when there is no
  // unk_token to stand for them. Empty for every real byte-level tokenizer.
  std::vector<uint8_t> dropped_bytes() const;
  // The first byte of `text` that encode() drops (one of dropped_bytes()), or -1 when none is.
  int first_dropped_byte(std::string_view text) const;
  // When true, special added tokens in the text are not matched but encoded as plain text
  // (`tokenizers`' encode_special_tokens). Default false, as in `tokenizers`.
  void set_encode_special_tokens(bool value);

 private:
  explicit BpeTokenizer(std::unique_ptr<BpeTokenizerImpl> impl);
  std::unique_ptr<BpeTokenizerImpl> impl_;
};

}  // namespace ingot::data
