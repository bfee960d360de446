// CUDA device helpers callable from plain C++ (.cpp files, tests): no CUDA headers here.
// Memory is plain cudaMalloc, never managed memory (DESIGN.md, principle 4). Every failure throws
// ingot::Error naming the CUDA call and what was asked for.
#pragma once
#include <cstdint>
#include <string>

#include "ingot/core/context.h"
#include "ingot/core/tensor.h"

namespace ingot::cuda {

// The cuBLASLt workspace each CudaState preallocates (enough for split-K on large GEMMs); the
// memory plan counts it as scratch.
constexpr int64_t kCublasLtWorkspaceBytes = int64_t{32} << 20;

bool device_available();                      // a CUDA device is present and usable
CudaState* create_state(int device_index);    // selects the device; stream, cuBLASLt, workspace
void destroy_state(CudaState* state);
// Matmul plans created from now on take cuBLASLt's first candidate (false) or the fastest
// bit-identical one (true, the default; see matmul.h). For tests and comparisons.
void set_gemm_tuning(CudaState* state, bool timed);

void* device_alloc(int64_t bytes);            // cudaMalloc; the error names bytes and free memory
void device_free(void* ptr);
// Both wait for completion: the host buffer may be reused as soon as they return.
// state may be null (legacy default stream).
void copy_to_device(void* dst, const void* src, int64_t bytes, CudaState* state);
void copy_to_host(void* dst, const void* src, int64_t bytes, CudaState* state);
void synchronize(CudaState* state);
// Page-locked host memory: copies to and from it run asynchronously on the stream.
void* host_alloc_pinned(int64_t bytes);
void host_free_pinned(void* ptr);
// Enqueue only: the host memory must stay untouched until the stream has passed the copy (wait
// on an event recorded after it). Truly asynchronous only for pinned host memory.
void copy_to_device_async(void* dst, const void* src, int64_t bytes, CudaState* state);
void copy_to_host_async(void* dst, const void* src, int64_t bytes, CudaState* state);
int64_t device_memory_free();
int64_t device_memory_total();
int64_t device_max_shared_memory_per_block();  // the opt-in limit of the current device
std::string device_name();
int device_compute_capability();  // of the current device: major * 10 + minor (90 on H100/H200)
std::string library_versions();  // "cuBLASLt <v>, cuDNN <v>" as loaded at run time

// CUDA graph of a whole step: ops enqueued between begin and end are recorded, not run; replay
// launches the recorded graph on the state's stream (asynchronously).
void begin_capture(CudaState* state);
void end_capture_and_instantiate(CudaState* state);
void replay(CudaState* state);
// Changes whenever the scratch buffer is reallocated (it only grows, outside capture): a graph
// captured under an older generation holds a freed address and must be captured again.
int64_t scratch_generation(const CudaState* state);
// Bytes the scratch buffer holds now (what the ops have needed so far, plus its growth slack).
int64_t scratch_bytes(const CudaState* state);
constexpr int64_t kScratchSlackBytes = int64_t{64} << 20;  // the most slack a growth adds
// Ends a capture that failed part-way and drops what was recorded (error paths only).
void abort_capture(CudaState* state);

// Event timing on the state's stream.
using Event = void*;
Event event_create();
void event_destroy(Event event);
void event_record(Event event, CudaState* state);
float event_elapsed_ms(Event start, Event end);  // waits for `end`
void event_synchronize(Event event);             // waits until the stream has passed the event

// ---- device-side ops beyond ops.h ---------------------------------------------------------------
// Sum of squares of `count` tensors (bf16 or f32), accumulated in f64 and written to
// *device_result (one device double) without synchronising: for global-norm clipping inside a
// captured step. Deterministic: per-block partials, then one ordered reduction. One launch per
// tensor plus one.
void sum_squares_async(Context& ctx, const Tensor* tensors, int count, double* device_result);

}  // namespace ingot::cuda
