// Packed rows split by document length, for the attention forward over segment ids on two engines:
// documents of at least kLongDocument tokens go to cuDNN as variable-length sequences (one cuDNN
// "batch" entry a document, ragged offsets into the packed tensors, a padding mask from their
// lengths), the shorter ones stay with the tensor-core kernels, which skip the tile pairs no short
// document spans. Built on the device from the segment ids (no host synchronisation, so a step
// that uses it can be captured in a CUDA graph).
//
// Why a length split and not every document on cuDNN: the table's size must be fixed when the
// plan is built, and a row of T tokens holds at most ceil(T / kLongDocument) long documents, at
// most one starting in each window [k L, (k+1) L) (a long document starting in it reaches at
// least its last token, so the next one starts in a later window).
// So slot b * slots_per_row + start / L is free for it, without a scan; a short document costs
// the tensor-core kernels only the tile pairs near the diagonal.
//
// Only rows whose ids never decrease as uint32 (the loader's 0, 1, 2, ... then -1 padding) are
// split: there, equal ids form one run, so a run is exactly what the ops.h contract calls a
// document. Any other row is left whole to the tensor-core kernels.
#pragma once
#include <cstdint>

#include "ingot/ops/cuda/cuda_state.h"

namespace ingot::cuda {

constexpr int kLongDocument = 256;          // tokens; shorter documents stay on the tensor cores
constexpr int kDocumentTableMaxT = 32768;   // the builder keeps 32 tokens a thread, 1024 threads

// Device arrays, carved from one buffer (document_table_at).
struct DocumentTable {
  int B = 0, T = 0, slots_per_row = 0;
  int64_t slots = 0;               // B * slots_per_row
  int32_t* seq_len = nullptr;      // (slots) the document's tokens; 0 for an unused slot
  int32_t* first_token = nullptr;  // (slots) its first token's index in the row
  int32_t* qkv_offset = nullptr;   // (slots + 1) elements from qkv (or dqkv) to its first token
  int32_t* out_offset = nullptr;   // (slots + 1) elements from out (or dout) to its first token
  uint8_t* short_token = nullptr;  // (B, T) 1 where the tensor-core kernels own the token
};

int64_t document_slots(int B, int T);        // B * ceil(T / kLongDocument)
int64_t document_table_bytes(int B, int T);  // a multiple of 256
// cuDNN's dense stats for the documents (slots, Hq, T) f32: bytes, a multiple of 256.
int64_t document_stats_bytes(int B, int T, int64_t Hq);
DocumentTable document_table_at(void* buffer, int B, int T);

// Fills the table from segment_ids (B, T); qkv_token and out_token: elements per token of qkv
// (Htot * D) and of out (Hq * D).
void build_document_table(CudaState& state, const DocumentTable& table, const int32_t* segment_ids,
                          int64_t qkv_token, int64_t out_token);

// stats (slots, Hq, T) f32, one dense row of log-sum-exps per document (cuDNN's layout), into
// lse (B, Hq, T) f32 (the op's): the long documents' values.
void document_stats_to_lse(CudaState& state, const DocumentTable& table, float* lse, const float* stats,
                           int Hq);

}  // namespace ingot::cuda
