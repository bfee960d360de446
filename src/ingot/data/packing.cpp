#include "ingot/data/packing.h"

#include <algorithm>

#include "ingot/core/error.h"
#include "ingot/data/loader.h"

namespace ingot::data {

PackingMode parse_packing_mode(const std::string& name) {
  if (name == "stream") return PackingMode::stream;
  if (name == "packed") return PackingMode::packed;
  if (name == "padded") return PackingMode::padded;
  fail("data: packing mode \"", name, "\" is not one of stream, packed, padded");
}

std::string packing_mode_name(PackingMode mode) {
  switch (mode) {
    case PackingMode::stream: return "stream";
    case PackingMode::packed: return "packed";
    case PackingMode::padded: return "padded";
  }
  return "?";
}

int64_t PackingPlan::num_tokens() const {
  int64_t n = 0;
  for (const PackedPiece& p : pieces) n += p.length;
  return n;
}

namespace {

// Max-tree over rows' free space, for first-fit in O(log rows). Rows not opened yet have T free,
// so "the leftmost row with room" is an open row when one fits and the next new row otherwise.
class FreeSpaceTree {
 public:
  FreeSpaceTree(int64_t max_rows, int64_t T) {
    size_ = 1;
    while (size_ < max_rows) size_ *= 2;
    tree_.assign(2 * size_, T);
  }
  int64_t first_with_room(int64_t need) const {
    int64_t node = 1;
    while (node < size_) node = tree_[2 * node] >= need ? 2 * node : 2 * node + 1;
    return node - size_;
  }
  void take(int64_t row, int64_t amount) {
    int64_t node = row + size_;
    tree_[node] -= amount;
    for (node /= 2; node >= 1; node /= 2) tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
  }

 private:
  int64_t size_;
  std::vector<int64_t> tree_;
};

}  // namespace

PackingPlan plan_rows(std::span<const DocumentSpan> documents, int64_t T, bool packed) {
  INGOT_CHECK(T > 0, "data: seq_len must be positive, got ", T);
  std::vector<PackedPiece> pieces;
  for (const DocumentSpan& d : documents) {
    INGOT_CHECK(d.length > 0, "data: empty document at stream offset ", d.begin);
    for (int64_t at = 0; at < d.length; at += T)
      pieces.push_back({d.begin + at, std::min(T, d.length - at), at + T < d.length});
  }
  const int64_t n = static_cast<int64_t>(pieces.size());
  std::vector<int64_t> row_of(n);
  int64_t num_rows = 0;
  if (packed && n > 0) {
    FreeSpaceTree tree(n, T);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = tree.first_with_room(pieces[i].length);
      tree.take(row, pieces[i].length);
      row_of[i] = row;
      num_rows = std::max(num_rows, row + 1);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) row_of[i] = i;
    num_rows = n;
  }
  // Counting sort by row, stable: a row keeps its pieces in arrival order.
  PackingPlan plan;
  plan.row_begin.assign(num_rows + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++plan.row_begin[row_of[i] + 1];
  for (int64_t r = 0; r < num_rows; ++r) plan.row_begin[r + 1] += plan.row_begin[r];
  std::vector<int64_t> next(plan.row_begin.begin(), plan.row_begin.end() - 1);
  plan.pieces.resize(n);
  for (int64_t i = 0; i < n; ++i) plan.pieces[next[row_of[i]]++] = pieces[i];
  return plan;
}

void fill_row(std::span<const PackedPiece> pieces, int64_t T, const TokenReader& read,
              int32_t* input_ids, int32_t* targets, int32_t* positions, int32_t* segment_ids) {
  std::vector<int32_t> tokens(T + 1);
  std::vector<uint8_t> mask(T + 1);
  int64_t at = 0;
  int32_t segment = 0;
  for (const PackedPiece& p : pieces) {
    INGOT_CHECK(at + p.length <= T, "data: pieces overflow a row of ", T, " tokens");
    const int64_t with_next = p.length + (p.continues ? 1 : 0);
    read(p.begin, with_next, tokens.data(), mask.data());
    for (int64_t t = 0; t < p.length; ++t) {
      input_ids[at + t] = tokens[t];
      const bool has_next = t + 1 < with_next;
      targets[at + t] = has_next && mask[t + 1] ? tokens[t + 1] : kIgnoreIndex;
      if (positions) positions[at + t] = static_cast<int32_t>(t);
      if (segment_ids) segment_ids[at + t] = segment;
    }
    at += p.length;
    ++segment;
  }
  for (int64_t t = at; t < T; ++t) {
    input_ids[t] = 0;
    targets[t] = kIgnoreIndex;
    if (positions) positions[t] = static_cast<int32_t>(t - at);
    if (segment_ids) segment_ids[t] = -1;
  }
}

}  // namespace ingot::data
