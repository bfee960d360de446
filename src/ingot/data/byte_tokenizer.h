// ByteTokenizer: one token per byte. Ids 0..255 are the bytes themselves, 256 is <|endoftext|>,
// the document separator; vocab_size() == 257. Any byte string round-trips, invalid UTF-8 included.
#pragma once
#include "ingot/data/tokenizer.h"

namespace ingot::data {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 256;
  static constexpr int64_t kVocabSize = 257;
  static constexpr std::string_view kEndOfTextText = "<|endoftext|>";

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  int32_t eos_id() const override { return kEndOfText; }
  std::string name() const override { return "byte"; }
};

}  // namespace ingot::data
