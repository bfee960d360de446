#include "ingot/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "ingot/core/error.h"

namespace ingot::data {

static_assert(std::endian::native == std::endian::little,
              "shards are little-endian and read in place; a big-endian host needs byte swaps");

namespace {

std::atomic<int64_t> g_mapped_shards{0};  // shards this process holds mapped, for the mmap error

constexpr uint64_t align8(uint64_t n) {
  return (n + 7) & ~uint64_t{7};
}

// Byte layout of the header; offsets are part of the file format.
struct HeaderFields {
  uint32_t version, token_width;
  uint64_t num_tokens, num_documents;
  uint32_t flags, vocab_size;
};

void encode_header(unsigned char* out, const HeaderFields& h) {
  std::memcpy(out + 0, kShardMagic, 8);
  std::memcpy(out + 8, &h.version, 4);
  std::memcpy(out + 12, &h.token_width, 4);
  std::memcpy(out + 16, &h.num_tokens, 8);
  std::memcpy(out + 24, &h.num_documents, 8);
  std::memcpy(out + 32, &h.flags, 4);
  std::memcpy(out + 36, &h.vocab_size, 4);
}

HeaderFields decode_header(const unsigned char* in) {
  HeaderFields h;
  std::memcpy(&h.version, in + 8, 4);
  std::memcpy(&h.token_width, in + 12, 4);
  std::memcpy(&h.num_tokens, in + 16, 8);
  std::memcpy(&h.num_documents, in + 24, 8);
  std::memcpy(&h.flags, in + 32, 4);
  std::memcpy(&h.vocab_size, in + 36, 4);
  return h;
}

void check_magic(const unsigned char* header, const std::string& path) {
  if (std::memcmp(header, kShardMagic, 8) != 0)
    fail("shard ", path, ": bad magic (expected \"INGOTTOK\"): not an Ingot token shard");
}

void write_bytes(std::FILE* file, const void* data, size_t bytes, const std::string& path) {
  if (bytes && std::fwrite(data, 1, bytes, file) != bytes)
    fail("shard ", path, ": write failed: ", std::strerror(errno));
}

void write_padding(std::FILE* file, uint64_t written, const std::string& path) {
  static const unsigned char zeros[8] = {};
  write_bytes(file, zeros, align8(written) - written, path);
}

}  // namespace

uint32_t shard_token_width_for_vocab(int64_t vocab_size) {
  return (vocab_size > 0 && vocab_size <= 65536) ? 2 : 4;
}

// ---- writer ----

ShardWriter::ShardWriter(std::string path, uint32_t token_width, uint32_t vocab_size,
                         bool has_loss_mask)
    : path_(std::move(path)),
      temp_path_(path_ + ".tmp"),
      token_width_(token_width),
      vocab_size_(vocab_size),
      has_loss_mask_(has_loss_mask) {
  INGOT_CHECK(token_width == 2 || token_width == 4, "shard ", path_, ": token width ", token_width,
              " is not 2 or 4");
  INGOT_CHECK(!(token_width == 2 && vocab_size > 65536), "shard ", path_, ": vocab size ",
              vocab_size, " does not fit 2-byte tokens");
  file_ = std::fopen(temp_path_.c_str(), "wb");
  if (!file_) fail("shard ", path_, ": cannot create ", temp_path_, ": ", std::strerror(errno));
  unsigned char header[kShardHeaderBytes] = {};  // placeholder; finish() writes the real one
  write_bytes(file_, header, sizeof header, path_);
}

ShardWriter::~ShardWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove(temp_path_.c_str());
  }
}

void ShardWriter::add_document(std::span<const int32_t> tokens,
                               std::span<const uint8_t> loss_mask) {
  INGOT_CHECK(file_, "shard ", path_, ": add_document after finish");
  INGOT_CHECK(!tokens.empty(), "shard ", path_, ": document ", num_documents(), " is empty");
  if (has_loss_mask_) {
    INGOT_CHECK(loss_mask.size() == tokens.size(), "shard ", path_, ": document ", num_documents(),
                " has ", tokens.size(), " tokens but a loss mask of ", loss_mask.size());
  } else {
    INGOT_CHECK(loss_mask.empty(), "shard ", path_,
                ": a loss mask was given but the shard was "
                "opened without one");
  }
  const uint64_t limit = vocab_size_ ? vocab_size_ : (token_width_ == 2 ? 65536ull : 1ull << 32);
  scratch_.resize(tokens.size() * token_width_);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    if (id < 0 || static_cast<uint64_t>(id) >= limit)
      fail("shard ", path_, ": token id ", id, " (document ", num_documents(), ", token ", i,
           ") is outside [0, ", limit, ")",
           vocab_size_ ? " (the vocabulary)" : " (the token width)");
    const uint32_t u = static_cast<uint32_t>(id);
    if (token_width_ == 2) {
      const uint16_t v = static_cast<uint16_t>(u);
      std::memcpy(&scratch_[i * 2], &v, 2);
    } else {
      std::memcpy(&scratch_[i * 4], &u, 4);
    }
  }
  if (has_loss_mask_) {
    for (size_t i = 0; i < loss_mask.size(); ++i)
      INGOT_CHECK(loss_mask[i] <= 1, "shard ", path_, ": loss mask value ", int(loss_mask[i]),
                  " (document ", num_documents(), ", token ", i, ") is not 0 or 1");
    loss_mask_.insert(loss_mask_.end(), loss_mask.begin(), loss_mask.end());
  }
  write_bytes(file_, scratch_.data(), scratch_.size(), path_);
  document_starts_.push_back(static_cast<uint64_t>(num_tokens_));
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void ShardWriter::finish() {
  INGOT_CHECK(file_, "shard ", path_, ": finish called twice");
  const uint64_t token_bytes = static_cast<uint64_t>(num_tokens_) * token_width_;
  write_padding(file_, kShardHeaderBytes + token_bytes, path_);
  write_bytes(file_, document_starts_.data(), document_starts_.size() * 8, path_);
  if (has_loss_mask_) {
    write_bytes(file_, loss_mask_.data(), loss_mask_.size(), path_);
    write_padding(file_, loss_mask_.size(), path_);
  }
  HeaderFields h{kShardVersion,
                 token_width_,
                 static_cast<uint64_t>(num_tokens_),
                 document_starts_.size(),
                 has_loss_mask_ ? kShardFlagLossMask : 0u,
                 vocab_size_};
  unsigned char header[kShardHeaderBytes];
  encode_header(header, h);
  if (std::fseek(file_, 0, SEEK_SET) != 0) fail("shard ", path_, ": seek failed");
  write_bytes(file_, header, sizeof header, path_);
  // fsync before the rename: otherwise a power cut can leave the shard's name on unwritten blocks.
  const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::remove(temp_path_.c_str());
    fail("shard ", path_, ": write failed: ", std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(temp_path_, path_, ec);
  if (ec) {
    std::remove(temp_path_.c_str());
    fail("shard ", path_, ": cannot rename ", temp_path_, ": ", ec.message());
  }
}

void write_shard(const std::string& path, const ShardData& data) {
  const size_t n = data.tokens.size();
  INGOT_CHECK(data.loss_mask.empty() || data.loss_mask.size() == n, "shard ", path,
              ": loss mask of ", data.loss_mask.size(), " for ", n, " tokens");
  INGOT_CHECK(n == 0 || (!data.document_starts.empty() && data.document_starts[0] == 0), "shard ",
              path, ": the first document must start at token 0");
  uint32_t width = data.token_width;
  if (width == 0) {
    int64_t bound = data.vocab_size;
    if (bound == 0)
      for (int32_t id : data.tokens) bound = std::max<int64_t>(bound, int64_t{id} + 1);
    width = shard_token_width_for_vocab(bound);
  }
  ShardWriter writer(path, width, data.vocab_size, !data.loss_mask.empty());
  const auto& starts = data.document_starts;
  for (size_t d = 0; d < starts.size(); ++d) {
    const uint64_t begin = starts[d], end = d + 1 < starts.size() ? starts[d + 1] : n;
    INGOT_CHECK(begin < end && end <= n, "shard ", path, ": document ", d, " spans [", begin, ", ",
                end, ") of ", n, " tokens; starts must be strictly ascending and < num_tokens");
    std::span<const int32_t> tokens(data.tokens.data() + begin, end - begin);
    std::span<const uint8_t> mask;
    if (!data.loss_mask.empty()) mask = {data.loss_mask.data() + begin, end - begin};
    writer.add_document(tokens, mask);
  }
  writer.finish();
}

// ---- reader ----

int64_t read_shard_token_count(const std::string& path) {
  unsigned char header[kShardHeaderBytes];
  std::ifstream file(path, std::ios::binary);
  if (!file.read(reinterpret_cast<char*>(header), kShardHeaderBytes))
    fail("shard ", path, ": cannot read its ", kShardHeaderBytes, "-byte header");
  check_magic(header, path);
  return static_cast<int64_t>(decode_header(header).num_tokens);
}

bool looks_like_shard(const std::string& path) {
  unsigned char header[kShardHeaderBytes];
  std::ifstream file(path, std::ios::binary);
  if (!file.read(reinterpret_cast<char*>(header), kShardHeaderBytes) || std::memcmp(header, kShardMagic, 8) != 0)
    return false;
  const HeaderFields h = decode_header(header);
  return h.version == kShardVersion && (h.token_width == 2 || h.token_width == 4);
}

Shard::Shard(const std::string& path) : path_(path) {
  struct stat path_st;  // before open: opening a FIFO would wait for a writer forever
  if (::stat(path.c_str(), &path_st) == 0 && !S_ISREG(path_st.st_mode))
    fail("shard ", path, ": not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("shard ", path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("shard ", path, ": cannot stat: ", std::strerror(err));
  }
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < static_cast<uint64_t>(kShardHeaderBytes)) {
    ::close(fd);
    fail("shard ", path, ": truncated: ", file_bytes, " bytes is smaller than the ",
         kShardHeaderBytes, "-byte header");
  }
  map_ = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    // ENOMEM with this many shards mapped: the process ran out of maps, one a shard (an address-space
    // limit gives ENOMEM too, with few).
    const int64_t limit = max_memory_maps(), mapped = g_mapped_shards.load();
    fail("shard ", path, ": mmap failed: ", std::strerror(map_errno),
         map_errno == ENOMEM && limit > 0 && mapped > limit / 2
             ? " with " + std::to_string(mapped) + " shards mapped (each shard is one memory map, and this system "
                   "allows " + std::to_string(limit) + " a process, vm.max_map_count): prepare the data again in "
                   "fewer shards, with a larger --shard-tokens, or raise vm.max_map_count"
             : std::string());
  }
  ++g_mapped_shards;
  map_bytes_ = file_bytes;
  record_ = MappedFileRecord(map_, file_bytes, path);  // a SIGBUS in the mapping names this file
  try {
    const auto* base = static_cast<const unsigned char*>(map_);
    check_magic(base, path);
    const HeaderFields h = decode_header(base);
    if (h.version != kShardVersion)
      fail("shard ", path, ": unsupported version ", h.version, " (this build reads version ",
           kShardVersion, ")");
    if (h.token_width != 2 && h.token_width != 4)
      fail("shard ", path, ": token width ", h.token_width, " is not 2 or 4");
    // The writer refuses this pair: 2-byte tokens hold ids up to 65535 only.
    if (h.token_width == 2 && h.vocab_size > 65536)
      fail("shard ", path, ": header records a vocabulary of ", h.vocab_size, " with 2-byte tokens, which hold ids up "
           "to 65535 only (corrupt)");
    if (h.flags & ~kShardKnownFlags)
      fail("shard ", path, ": unknown flag bits 0x", std::hex, (h.flags & ~kShardKnownFlags));
    // Bound the counts before multiplying so a corrupt header cannot overflow the size sum.
    const uint64_t max_count = file_bytes;
    if (h.num_tokens > max_count || h.num_documents > max_count / 8)
      fail("shard ", path, ": header claims ", h.num_tokens, " tokens and ", h.num_documents,
           " documents, more than a ", file_bytes, "-byte file can hold (truncated or corrupt)");
    const bool has_mask = h.flags & kShardFlagLossMask;
    const uint64_t tokens_at = kShardHeaderBytes;
    const uint64_t starts_at = align8(tokens_at + h.num_tokens * h.token_width);
    const uint64_t mask_at = starts_at + h.num_documents * 8;
    const uint64_t expected = has_mask ? align8(mask_at + h.num_tokens) : mask_at;
    if (file_bytes != expected)
      fail("shard ", path, ": file is ", file_bytes, " bytes but its header (", h.num_tokens,
           " tokens of ", h.token_width, " bytes, ", h.num_documents, " documents",
           has_mask ? ", loss mask" : "", ") needs ", expected,
           file_bytes < expected ? " (truncated)" : " (trailing bytes)");
    // The padding to 8 bytes after the tokens (and after the mask) is zero as written: a header whose
    // token count is up to 3 short fits the same file size, and its last tokens were dropped unseen.
    auto check_zero_padding = [&](uint64_t from, uint64_t to, const char* after) {
      for (uint64_t at = from; at < to; ++at)
        if (base[at] != 0)
          fail("shard ", path, ": the padding after the ", after, " holds a non-zero byte at offset ", at,
               " (the header's count of ", h.num_tokens, " tokens may be short: corrupt)");
    };
    check_zero_padding(tokens_at + h.num_tokens * h.token_width, starts_at, "tokens");
    if (has_mask) check_zero_padding(mask_at + h.num_tokens, expected, "loss mask");
    token_width_ = h.token_width;
    vocab_size_ = h.vocab_size;
    num_tokens_ = static_cast<int64_t>(h.num_tokens);
    num_documents_ = static_cast<int64_t>(h.num_documents);
    tokens_ = base + tokens_at;
    document_starts_ = reinterpret_cast<const uint64_t*>(base + starts_at);
    loss_mask_ = has_mask ? base + mask_at : nullptr;

    if (num_tokens_ == 0 && num_documents_ != 0)
      fail("shard ", path, ": ", num_documents_, " documents but no tokens");
    if (num_tokens_ > 0 && num_documents_ == 0)
      fail("shard ", path, ": ", num_tokens_, " tokens but no document starts");
    for (int64_t d = 0; d < num_documents_; ++d) {
      const uint64_t s = document_starts_[d];
      if (d == 0 && s != 0) fail("shard ", path, ": first document starts at ", s, ", not 0");
      if (d > 0 && s <= document_starts_[d - 1])
        fail("shard ", path, ": document starts not strictly ascending at document ", d, " (", s,
             " after ", document_starts_[d - 1], ")");
      if (s >= h.num_tokens)
        fail("shard ", path, ": document ", d, " starts at ", s, ", past the last token (",
             h.num_tokens, " tokens)");
    }
  } catch (...) {
    unmap();
    throw;
  }
}

Shard::~Shard() {
  unmap();
}

void Shard::unmap() {
  record_ = MappedFileRecord();
  if (map_) {
    ::munmap(map_, map_bytes_);
    --g_mapped_shards;
  }
  map_ = nullptr;
  map_bytes_ = 0;
}

Shard::Shard(Shard&& other) noexcept {
  *this = std::move(other);
}

Shard& Shard::operator=(Shard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    record_ = std::move(other.record_);
    token_width_ = other.token_width_;
    vocab_size_ = other.vocab_size_;
    num_tokens_ = other.num_tokens_;
    num_documents_ = other.num_documents_;
    tokens_ = std::exchange(other.tokens_, nullptr);
    document_starts_ = std::exchange(other.document_starts_, nullptr);
    loss_mask_ = std::exchange(other.loss_mask_, nullptr);
  }
  return *this;
}

void Shard::read_tokens(int64_t begin, int64_t count, int32_t* out) const {
  if (token_width_ == 2) {
    const auto* src = reinterpret_cast<const uint16_t*>(tokens_) + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = src[i];
  } else {
    const auto* src = reinterpret_cast<const uint32_t*>(tokens_) + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(src[i]);
  }
}

int64_t max_memory_maps() {
  std::ifstream in("/proc/sys/vm/max_map_count");
  int64_t limit = -1;
  return in >> limit ? limit : -1;
}

namespace {
// Chunked scan: a branch-free max per chunk (which vectorizes), then a search only in a chunk
// whose max reaches the limit.
template <typename T>
int64_t find_at_least(const T* p, int64_t n, uint64_t limit) {
  constexpr int64_t kChunk = 1 << 16;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    T m = 0;
    for (int64_t i = begin; i < end; ++i) m = std::max(m, p[i]);
    if (m < limit) continue;
    for (int64_t i = begin; i < end; ++i)
      if (p[i] >= limit) return i;
  }
  return -1;
}
}  // namespace

int64_t Shard::find_token_at_least(uint64_t limit) const {
  if (token_width_ == 2)
    return find_at_least(reinterpret_cast<const uint16_t*>(tokens_), num_tokens_, limit);
  return find_at_least(reinterpret_cast<const uint32_t*>(tokens_), num_tokens_, limit);
}

}  // namespace ingot::data
