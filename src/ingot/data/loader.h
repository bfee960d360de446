// DataLoader: rows of T tokens over token shards, in one of three modes (PackingMode):
//   stream  fixed windows over the concatenated stream, crossing documents (described below);
//   packed  whole documents packed into rows with per-document positions and segment ids;
//   padded  one document per row, padded.
// The packed and padded modes are described at the end of this comment and in packing.h.
//
// Stream mode. The shards (in the order given; a directory or glob expands to its files sorted by name) form
// one concatenated token stream of N tokens. A window is T+1 consecutive tokens starting at a
// multiple of T: inputs are its first T tokens, targets its last T (shifted by one); a target whose
// loss-mask byte is 0 becomes -100 (ignored by the loss). Windows may straddle shard boundaries.
//
// Split (deterministic, independent of the seed): the last windows of the stream are validation,
// the rest training.
//   train window i (0 <= i < num_train): tokens [i*T, i*T + T]
//   val window j   (0 <= j < num_val):   tokens [V + j*T, V + j*T + T], V = num_train*T + 1
// so no token is shared between the two sets. num_val = max(1, floor(W * val_fraction)) where
// W = floor((N - 1) / T) is the number of windows the whole stream holds (0 when val_fraction ==
// 0), and num_train is as many windows as fit in front of the validation windows.
//
// Order: epoch e visits every train window exactly once, in a Fisher-Yates permutation driven by
// std::mt19937_64(seed + e * 0x9e3779b97f4a7c15) (both fully specified by the C++ standard, so the
// order is the same on every platform). The stride keeps seeds apart: with seed + e, seed s + 1's
// epoch 0 was seed s's epoch 1, so a sweep over adjacent seeds trained on shifted copies of one
// order. Epoch 0 is seed itself, as before. A state saved by a run that used seed + e
// (checkpoints before 2026-12-01's change) resumes with seed + e, so the run keeps its order.
// A batch that reaches the end of an epoch continues into the next one. The cursor (epoch, index
// into the epoch's permutation) is all the state there is, so saving and restoring it resumes the
// exact batch sequence.
//
// Packed / padded modes work on documents (the shards' document boundaries; a document never
// spans two shards). Split: the last num_val_docs = max(1, floor(D * val_fraction)) documents of
// the stream (0 when val_fraction == 0) are validation, the rest training. Epoch e shuffles the
// training documents with the same Fisher-Yates and epoch seed as windows, then plans its
// rows with plan_rows (packing.h); the validation rows are planned once, in stream order. The
// cursor is (epoch, row index into that epoch's plan); the plan is a pure function of the seed and
// the epoch, so the cursor again is the whole state. Epochs may differ in row count.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "ingot/data/packing.h"
#include "ingot/data/shard.h"

namespace ingot::data {

// Epoch e's shuffle seed is seed + e * kEpochSeedStride (the 64-bit golden ratio; see Order above).
inline constexpr uint64_t kEpochSeedStride = 0x9e3779b97f4a7c15ull;

struct DataLoaderConfig {
  std::vector<std::string> paths;  // each a shard file, a directory (its *.bin files) or a glob
  int64_t seq_len = 0;             // T: tokens per row
  int64_t vocab_size = 0;          // the model's vocabulary: every token id must be below it
  double val_fraction = 0.05;      // share of windows held out for validation, in [0, 1)
  uint64_t seed = 0;               // shuffling seed; epoch e uses seed + e * kEpochSeedStride
  PackingMode packing = PackingMode::stream;
  bool use_loss_mask = true;       // false: train on every target (train_on_inputs at load time)
};

// The mode for a config value: "stream" | "packed" | "padded", or "auto": packed when any of the
// shards (path specs as in DataLoaderConfig::paths) has a loss mask (SFT data), else stream.
PackingMode resolve_packing_mode(const std::string& name, const std::vector<std::string>& paths);

// Host buffers for one batch, each (B, T) int32 row-major. positions and segment_ids may be null
// when the caller does not want them.
struct BatchBuffers {
  int32_t* input_ids = nullptr;    // (B, T) token ids
  int32_t* targets = nullptr;      // (B, T) next-token ids, -100 where the loss is masked
  int32_t* positions = nullptr;    // (B, T) position: 0..T-1 for stream windows, per document
                                   // when packed
  int32_t* segment_ids = nullptr;  // (B, T) attention segment: all 0 for stream windows; 0, 1, ...
                                   // per document and -1 for padding when packed / padded
};

inline constexpr int32_t kIgnoreIndex = -100;

// Where the train stream stands: epoch, and how many windows of that epoch were already served.
struct DataCursor {
  int64_t epoch = 0;
  int64_t index = 0;
};

// Expands shard path specs: a glob (contains * ? or [) to its matches, a directory to its *.bin
// files, a file to itself; each spec's files sorted by name. Throws when a spec matches nothing.
std::vector<std::string> resolve_shard_paths(const std::vector<std::string>& specs);

class DataLoader;

// Walks the validation windows in order. reset() before each evaluation.
class ValIterator {
 public:
  explicit ValIterator(const DataLoader& loader) : loader_(&loader) {}
  void reset() { next_ = 0; }
  bool done() const;
  int64_t num_windows() const;
  // Fills up to batch_size rows with the next windows and returns how many are real (0 once
  // done). Rows past that are padding: input 0, targets -100, positions 0..T-1, segment 0 (-1 in
  // the packed and padded modes).
  int64_t next_batch(int64_t batch_size, const BatchBuffers& out);

 private:
  const DataLoader* loader_;
  int64_t next_ = 0;
};

class DataLoader {
 public:
  // Opens and validates every shard, checks every token id against vocab_size (one pass over the
  // data) and plans the split. Throws ingot::Error naming the file on any problem.
  explicit DataLoader(const DataLoaderConfig& config);
  // Iterators keep a pointer to the loader, so it stays put.
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Fills batch_size training rows and advances the cursor by batch_size windows.
  void next_batch(int64_t batch_size, const BatchBuffers& out);
  // A fresh iterator over the validation windows (keep it and reset() it for each eval).
  ValIterator validation() const { return ValIterator(*this); }

  DataCursor cursor() const { return cursor_; }
  // {"epoch", "index", "seed", "seq_len", "num_train_windows", "num_tokens", "packing",
  //  "epoch_seed_stride", "token_fingerprint", "num_val_windows", and with packing "num_train_documents"};
  // restore_state() rejects a state from a different seed, seq_len, packing mode or dataset (a
  // state without "packing" is a stream-mode state).
  nlohmann::json save_state() const;
  void restore_state(const nlohmann::json& state);
  // What of a saved state disagrees with this loader's settings and data (seed, seq_len, packing,
  // the dataset, the split), as restore_state's message; "" when nothing does, or when the state is
  // malformed (restore_state names that). Lets a caller tell a changed config from damage, and, by
  // *setting, which setting differs.
  enum class StateSetting { none, packing, seed, seq_len, data, split };
  std::string state_mismatch(const nlohmann::json& state, StateSetting* setting = nullptr) const;
  // What is malformed in a saved state, naming the key (a key missing, or a value that is not a
  // non-negative integer, or packing not a string); "" when nothing is.
  static std::string malformed_state(const nlohmann::json& state);

  int64_t seq_len() const { return seq_len_; }
  int64_t num_tokens() const { return num_tokens_; }
  PackingMode packing() const { return mode_; }
  // Stream mode: windows. Packed / padded: rows (of epoch 0 for training).
  int64_t num_train_windows() const { return num_train_; }
  int64_t num_val_windows() const { return num_val_; }
  // Packed / padded modes: documents in the training and validation splits.
  int64_t num_train_documents() const { return num_train_docs_; }
  int64_t num_val_documents() const { return static_cast<int64_t>(documents_.size()) - num_train_docs_; }
  // Packed / padded modes: the rows of epoch `epoch` (planned on demand; the last one is cached).
  const PackingPlan& train_plan(int64_t epoch);
  const PackingPlan& val_plan() const { return val_plan_; }
  const std::vector<std::string>& files() const { return files_; }
  // Offsets into the concatenated stream of a window's first token.
  int64_t train_window_start(int64_t i) const { return i * seq_len_; }
  int64_t val_window_start(int64_t j) const { return val_begin_ + j * seq_len_; }
  // The train window served at position `index` of epoch `epoch`.
  int64_t train_window_at(int64_t epoch, int64_t index);
  // One line for the start-up log: files, tokens, windows.
  std::string summary() const;

 private:
  friend class ValIterator;
  void fill_row(int64_t start, int64_t row, const BatchBuffers& out) const;
  void fill_plan_row(std::span<const PackedPiece> pieces, int64_t row, const BatchBuffers& out) const;
  void fill_val_row(int64_t j, int64_t row, const BatchBuffers& out) const;
  void gather(int64_t start, int64_t count, int32_t* tokens, uint8_t* mask) const;
  void ensure_permutation(int64_t epoch);
  void plan_documents(double val_fraction);
  bool by_document() const { return mode_ != PackingMode::stream; }
  uint64_t token_fingerprint() const;

  std::vector<std::string> files_;
  std::vector<Shard> shards_;         // non-empty shards, in stream order
  std::vector<int64_t> shard_begin_;  // (num_shards + 1,) stream offset of each shard's token 0
  uint64_t fingerprint_ = 0;          // token_fingerprint(), saved with the cursor
  bool any_loss_mask_ = false;
  bool use_loss_mask_ = true;
  int64_t seq_len_, num_tokens_ = 0, num_train_ = 0, num_val_ = 0, val_begin_ = 0;
  uint64_t seed_;
  uint64_t epoch_seed_stride_ = kEpochSeedStride;  // 1 for a state saved before the stride (restore_state)
  DataCursor cursor_;
  int64_t permutation_epoch_ = -1;
  std::vector<uint64_t> permutation_;  // (num_train,) window (or document) order of permutation_epoch_
  PackingMode mode_;
  std::vector<DocumentSpan> documents_;  // (D,) packed / padded modes: every document, stream order
  int64_t num_train_docs_ = 0;
  PackingPlan val_plan_, train_plan_;    // train_plan_ is for epoch plan_epoch_
  int64_t plan_epoch_ = -1;
  mutable std::vector<int32_t> window_tokens_;  // (T + 1,) scratch
  mutable std::vector<uint8_t> window_mask_;    // (T + 1,) scratch
};

}  // namespace ingot::data
