#include "ingot/data/byte_tokenizer.h"

#include "ingot/core/error.h"

namespace ingot::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id >= 0 && id < 256) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (id == kEndOfText) {
      text.append(kEndOfTextText);
    } else {
      fail("byte tokenizer: token id ", id, " at index ", i, " is outside the vocabulary [0, ",
           kVocabSize, ")");
    }
  }
  return text;
}

}  // namespace ingot::data
