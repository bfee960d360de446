// The document table of attention_documents.h: one block per row finds each token's document
// (a run of equal ids) with two block scans, marks the tokens of long documents and files each
// long document under its slot.
#include "ingot/ops/cuda/attention_documents.h"
#include "ingot/ops/cuda/common.cuh"

namespace ingot::cuda {

namespace {

constexpr int kBuilderThreads = 1024;
constexpr int kMaxTokensPerThread = kDocumentTableMaxT / kBuilderThreads;

int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }
int slots_per_row(int T) { return int(ceil_div(T, kLongDocument)); }

// Hillis-Steele scan over the block (blockDim.x == kBuilderThreads) with a max or min combine:
// returns the combination over the threads strictly before this one (forward) or strictly after
// it (backward), or `identity` when there are none.
template <bool kMax, bool kBackward>
__device__ int block_exclusive_scan(int value, int identity, int* buffer) {
  const int n = blockDim.x, me = kBackward ? n - 1 - int(threadIdx.x) : int(threadIdx.x);
  buffer[me] = value;
  __syncthreads();
  for (int step = 1; step < n; step <<= 1) {
    const int other = me >= step ? buffer[me - step] : identity;
    __syncthreads();
    buffer[me] = kMax ? max(buffer[me], other) : min(buffer[me], other);
    __syncthreads();
  }
  const int result = me > 0 ? buffer[me - 1] : identity;
  __syncthreads();
  return result;
}

__global__ void __launch_bounds__(kBuilderThreads)
    build_document_table_kernel(DocumentTable table, const int32_t* segment_ids, int64_t qkv_token,
                                int64_t out_token) {
  __shared__ int scan[kBuilderThreads];
  const int b = blockIdx.x, T = table.T, spr = table.slots_per_row;
  const int32_t* ids = segment_ids + int64_t(b) * T;
  const int64_t row0 = int64_t(b) * T;

  // Unused slots: no tokens, offsets at their window's start (so offsets never decrease).
  for (int k = threadIdx.x; k < spr; k += blockDim.x) {
    const int64_t slot = int64_t(b) * spr + k;
    const int at = min(k * kLongDocument, T);
    table.seq_len[slot] = 0;
    table.first_token[slot] = at;
    table.qkv_offset[slot] = int32_t((row0 + at) * qkv_token);
    table.out_offset[slot] = int32_t((row0 + at) * out_token);
  }
  if (b == table.B - 1 && threadIdx.x == 0) {
    table.qkv_offset[table.slots] = int32_t((row0 + T) * qkv_token);
    table.out_offset[table.slots] = int32_t((row0 + T) * out_token);
  }

  // This thread's tokens [t0, t1).
  const int per = (T + kBuilderThreads - 1) / kBuilderThreads;
  const int t0 = min(T, int(threadIdx.x) * per), t1 = min(T, t0 + per);
  auto starts_run = [&](int t) { return t == 0 || ids[t] != ids[t - 1]; };
  auto ends_run = [&](int t) { return t == T - 1 || ids[t] != ids[t + 1]; };

  bool unsorted = false;
  for (int t = max(t0, 1); t < t1; ++t) unsorted |= uint32_t(ids[t - 1]) > uint32_t(ids[t]);
  const bool sorted = !__syncthreads_or(unsorted);

  int last_start = -1, first_end = T;
  for (int t = t0; t < t1; ++t) {
    if (starts_run(t)) last_start = t;
    if (first_end == T && ends_run(t)) first_end = t;
  }
  int start = block_exclusive_scan<true, false>(last_start, -1, scan);  // before my tokens
  int end = block_exclusive_scan<false, true>(first_end, T, scan);      // after my tokens

  int token_start[kMaxTokensPerThread];
  for (int t = t0; t < t1; ++t) {
    if (starts_run(t)) start = t;
    token_start[t - t0] = start;
  }
  __syncthreads();  // the unused-slot defaults are written before any slot is claimed
  for (int t = t1 - 1; t >= t0; --t) {
    if (ends_run(t)) end = t;
    const int first = token_start[t - t0], length = end - first + 1;
    const bool long_document = sorted && length >= kLongDocument;
    table.short_token[row0 + t] = long_document ? 0 : 1;
    if (long_document && first == t) {
      const int64_t slot = int64_t(b) * spr + t / kLongDocument;
      table.seq_len[slot] = length;
      table.first_token[slot] = t;
      table.qkv_offset[slot] = int32_t((row0 + t) * qkv_token);
      table.out_offset[slot] = int32_t((row0 + t) * out_token);
    }
  }
}

// One thread per (slot, head, token of the slot's window of T): the document's tokens only.
__global__ void document_stats_kernel(DocumentTable table, float* lse, const float* stats, int Hq) {
  const int64_t n = table.slots * Hq * table.T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(i % table.T);
    const int64_t slot_head = i / table.T, slot = slot_head / Hq;
    if (t >= table.seq_len[slot]) continue;
    const int h = int(slot_head % Hq), b = int(slot / table.slots_per_row);
    const int64_t l = (int64_t(b) * Hq + h) * table.T + table.first_token[slot] + t;
    lse[l] = stats[i];
  }
}

}  // namespace

int64_t document_slots(int B, int T) { return int64_t(B) * slots_per_row(T); }

int64_t document_table_bytes(int B, int T) {
  const int64_t slots = document_slots(B, T);
  return align256(2 * slots * 4) + align256(2 * (slots + 1) * 4) + align256(int64_t(B) * T);
}

int64_t document_stats_bytes(int B, int T, int64_t Hq) { return align256(document_slots(B, T) * Hq * T * 4); }

DocumentTable document_table_at(void* buffer, int B, int T) {
  DocumentTable t;
  t.B = B;
  t.T = T;
  t.slots_per_row = slots_per_row(T);
  t.slots = int64_t(B) * t.slots_per_row;
  char* p = static_cast<char*>(buffer);
  const int64_t slots = t.slots;
  t.seq_len = reinterpret_cast<int32_t*>(p);
  t.first_token = t.seq_len + slots;
  p += align256(2 * slots * 4);
  t.qkv_offset = reinterpret_cast<int32_t*>(p);
  t.out_offset = t.qkv_offset + slots + 1;
  p += align256(2 * (slots + 1) * 4);
  t.short_token = reinterpret_cast<uint8_t*>(p);
  return t;
}

void build_document_table(CudaState& state, const DocumentTable& table, const int32_t* segment_ids,
                          int64_t qkv_token, int64_t out_token) {
  INGOT_CHECK(table.T <= kDocumentTableMaxT, "build_document_table: T = ", table.T, " is above ",
              kDocumentTableMaxT);
  build_document_table_kernel<<<unsigned(table.B), kBuilderThreads, 0, state.stream>>>(
      table, segment_ids, qkv_token, out_token);
  INGOT_LAUNCH_CHECK("build_document_table_kernel");
}

void document_stats_to_lse(CudaState& state, const DocumentTable& table, float* lse, const float* stats,
                           int Hq) {
  const int64_t n = table.slots * Hq * table.T;
  document_stats_kernel<<<grid_for(n, 256, state), 256, 0, state.stream>>>(table, lse, stats, Hq);
  INGOT_LAUNCH_CHECK("document_stats_kernel");
}

}  // namespace ingot::cuda
