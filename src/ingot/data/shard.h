// Token shards: the on-disk format of tokenized training data (specified in docs/data-format.md).
//
// Layout, little-endian, every section starting on an 8-byte boundary (zero padding between):
//   header (40 bytes): magic "INGOTTOK" | u32 version=1 | u32 token_width (2|4) | u64 num_tokens |
//                      u64 num_documents | u32 flags (bit0: has loss mask) | u32 vocab_size (0:
//                      unknown)
//   tokens          num_tokens x token_width bytes, unsigned
//   document starts num_documents x u64: first 0, strictly ascending, each < num_tokens
//   loss mask       num_tokens x u8 (0 or 1), only when flags bit0 is set
// Invariants a valid shard keeps: the file size equals the sum of the padded sections; a shard with
// tokens has at least one document and its first starts at token 0; every document is non-empty.
// Writers write NAME.tmp and rename it to NAME, so a reader never sees a half-written shard.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ingot/core/mapped_files.h"

namespace ingot::data {

inline constexpr char kShardMagic[8] = {'I', 'N', 'G', 'O', 'T', 'T', 'O', 'K'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint32_t kShardFlagLossMask = 1u << 0;
inline constexpr uint32_t kShardKnownFlags = kShardFlagLossMask;
inline constexpr int64_t kShardHeaderBytes = 40;

// 2 when every id of a vocabulary of this size fits in u16 (0 < vocab_size <= 65536), else 4.
uint32_t shard_token_width_for_vocab(int64_t vocab_size);

// Streams one shard to disk: tokens go straight to PATH.tmp; document starts and the loss mask are
// kept in memory (8 bytes per document, 1 byte per token) until finish() appends them, rewrites the
// header and renames PATH.tmp to PATH. A writer destroyed before finish() removes PATH.tmp.
class ShardWriter {
 public:
  // token_width: 2 or 4. vocab_size: of the tokenizer that produced the ids (0: unknown); when
  // known, every id must be < vocab_size.
  ShardWriter(std::string path, uint32_t token_width, uint32_t vocab_size, bool has_loss_mask);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one non-empty document. loss_mask: one 0/1 byte per token when the shard has a mask
  // (1: the token is a training target), empty otherwise.
  void add_document(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask = {});
  // Writes the trailing sections and the header, then renames PATH.tmp to PATH.
  void finish();

  const std::string& path() const { return path_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return static_cast<int64_t>(document_starts_.size()); }

 private:
  std::string path_, temp_path_;
  uint32_t token_width_, vocab_size_;
  bool has_loss_mask_;
  std::FILE* file_ = nullptr;
  int64_t num_tokens_ = 0;
  std::vector<uint64_t> document_starts_;  // (num_documents,)
  std::vector<uint8_t> loss_mask_;         // (num_tokens,) when has_loss_mask_
  std::vector<unsigned char> scratch_;     // tokens packed to token_width_
};

// Whole-shard contents in memory, for small shards and tests.
struct ShardData {
  std::vector<int32_t> tokens;            // (num_tokens,)
  std::vector<uint64_t> document_starts;  // (num_documents,) first 0, strictly ascending
  std::vector<uint8_t> loss_mask;         // (num_tokens,) or empty for no mask
  uint32_t vocab_size = 0;                // 0: unknown
  uint32_t token_width = 0;               // 0: shard_token_width_for_vocab(vocab or max id + 1)
};
void write_shard(const std::string& path, const ShardData& data);

// The token count a shard's header records, from its first bytes alone (no map, no validation
// beyond the magic): for checks that run before the shard is opened (the loader's meta.json check).
int64_t read_shard_token_count(const std::string& path);
// Whether the file starts as a shard does: the magic, then a known version and token width (so a
// text that happens to start with "INGOTTOK" is not one). Reads only the header; never fails.
bool looks_like_shard(const std::string& path);

// How many memory maps the kernel lets one process hold (Linux's vm.max_map_count; 65530 unless
// raised), or -1 where it cannot be read. Training maps every shard, so a dataset of more shards
// than this cannot be opened.
int64_t max_memory_maps();

// A validated, read-only memory map of one shard. Move-only; unmaps on destruction.
// Opening checks the magic, version, token width, flags, that the file size matches the header's
// section sizes, and that document starts are 0, strictly ascending and < num_tokens. Token ids are
// not range-checked here (that needs the model's vocabulary: see DataLoader). Every error names
// the file.
class Shard {
 public:
  explicit Shard(const std::string& path);
  ~Shard();
  Shard(Shard&& other) noexcept;
  Shard& operator=(Shard&& other) noexcept;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& path() const { return path_; }
  uint32_t token_width() const { return token_width_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return num_documents_; }
  uint32_t vocab_size() const { return vocab_size_; }
  bool has_loss_mask() const { return loss_mask_ != nullptr; }

  uint32_t token(int64_t i) const {
    return token_width_ == 2 ? reinterpret_cast<const uint16_t*>(tokens_)[i]
                             : reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  // Copies tokens [begin, begin + count) into out as int32.
  void read_tokens(int64_t begin, int64_t count, int32_t* out) const;
  // Index of the first token whose id is >= limit, or -1 when every id is below it.
  int64_t find_token_at_least(uint64_t limit) const;
  std::span<const uint64_t> document_starts() const {
    return {document_starts_, static_cast<size_t>(num_documents_)};
  }
  // (num_tokens,) 0/1 bytes; empty when the shard has no mask.
  std::span<const uint8_t> loss_mask() const {
    return {loss_mask_, loss_mask_ ? static_cast<size_t>(num_tokens_) : 0};
  }

 private:
  void unmap();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  MappedFileRecord record_;
  uint32_t token_width_ = 0, vocab_size_ = 0;
  int64_t num_tokens_ = 0, num_documents_ = 0;
  const unsigned char* tokens_ = nullptr;
  const uint64_t* document_starts_ = nullptr;
  const uint8_t* loss_mask_ = nullptr;
};

}  // namespace ingot::data
