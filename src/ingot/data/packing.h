// Packing: documents of a token stream laid into rows of exactly T tokens, without letting a
// token see or predict across a document boundary.
//
// Planning (plan_rows): a document longer than T is cut into pieces of T tokens (the last piece
// holds the rest). In packed mode pieces are placed first-fit, in the order given (the loader
// shuffles documents first): each piece goes into the first row that still has room for it, else
// a new row; rows are served in the order they were opened. In padded mode each piece gets its own
// row. Every token of every document lands in exactly one row, once.
//
// A row (fill_row): pieces one after another, then padding up to T.
//   input_ids[t]   the piece's token; padding: 0
//   targets[t]     the next token of the same document, or -100 when there is none (the
//                  document's last token: never predict across a boundary) or when that next
//                  token's loss-mask byte is 0; the last token of a piece cut from a longer
//                  document predicts the document's next token (the first of the next piece).
//                  Padding: -100
//   positions[t]   0, 1, ... restarting at each piece (a cut-off piece restarts at 0 too: it cannot
//                  attend to its earlier part); padding: 0, 1, ... as well
//   segment_ids[t] 0, 1, 2, ... one per piece in the row; padding: -1 (attention only matches
//                  equal segment ids, so padding attends only to padding and nothing attends to it)
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace ingot::data {

// How the DataLoader turns the token stream into rows.
enum class PackingMode {
  stream,  // fixed windows over the concatenated stream, crossing documents (pretraining)
  packed,  // documents packed into rows with document masking (see above)
  padded,  // one document (piece) per row, padded
};
// "stream" | "packed" | "padded"; throws ingot::Error naming the accepted values.
PackingMode parse_packing_mode(const std::string& name);
std::string packing_mode_name(PackingMode mode);

struct DocumentSpan {
  int64_t begin = 0;   // offset of the first token in the stream
  int64_t length = 0;  // > 0
};

struct PackedPiece {
  int64_t begin = 0;      // stream offset of its first token
  int64_t length = 0;     // 1..T
  bool continues = false; // the document goes on after this piece
};

struct PackingPlan {
  std::vector<PackedPiece> pieces;  // rows' pieces, row by row
  std::vector<int64_t> row_begin;   // (num_rows + 1,) index of each row's first piece
  int64_t num_rows() const { return static_cast<int64_t>(row_begin.size()) - 1; }
  std::span<const PackedPiece> row(int64_t r) const {
    return {pieces.data() + row_begin[r], static_cast<size_t>(row_begin[r + 1] - row_begin[r])};
  }
  int64_t num_tokens() const;  // sum of piece lengths
};

PackingPlan plan_rows(std::span<const DocumentSpan> documents, int64_t seq_len, bool packed);

// Reads `count` tokens of the stream from `begin` into tokens, and their loss-mask bytes into
// mask (1 everywhere for data without a mask).
using TokenReader = std::function<void(int64_t begin, int64_t count, int32_t* tokens, uint8_t* mask)>;

// Writes one row (T entries at each non-null pointer) as described above.
void fill_row(std::span<const PackedPiece> pieces, int64_t seq_len, const TokenReader& read,
              int32_t* input_ids, int32_t* targets, int32_t* positions, int32_t* segment_ids);

}  // namespace ingot::data
