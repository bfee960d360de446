// Tokenizer: the interface every tokenizer implements (byte-level now, tokenizer.json BPE later).
// Invariants: encode() never adds special tokens (callers add special_prefix() / special_suffix()
// and eos_id() around each document);
// every id encode() returns is in [0, vocab_size()); decode(encode(s)) == s for any byte string
// the tokenizer can represent. Implementations are immutable after construction, so one instance
// may be shared across threads.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ingot::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Text -> token ids, without special tokens.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Token ids -> text; special tokens decode to their literal form (e.g. "<|endoftext|>").
  // Throws ingot::Error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Number of ids, special tokens included; every valid id is < vocab_size().
  virtual int64_t vocab_size() const = 0;
  // The document separator appended after every document when data is prepared.
  virtual int32_t eos_id() const = 0;
  // Short identifier written to meta.json (e.g. "byte").
  virtual std::string name() const = 0;
  // The special tokens the tokenizer puts around one text, as `tokenizers`' encode(text,
  // add_special_tokens=true) does (Llama 3: <|begin_of_text|> before it; Qwen: none). prepare adds
  // them to every text document and generate puts the prefix before the prompt.
  virtual std::vector<int32_t> special_prefix() const { return {}; }
  virtual std::vector<int32_t> special_suffix() const { return {}; }
};

}  // namespace ingot::data
