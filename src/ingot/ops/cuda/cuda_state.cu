// CudaState lifecycle and the device helpers of device.h: allocation, copies, graph capture,
// events, scratch growth, the lazily created cuDNN handle.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ingot/core/env.h"
#include "ingot/ops/cuda/attention_wgmma.cuh"
#include "ingot/ops/cuda/common.cuh"
#include "ingot/ops/cuda/device.h"

namespace ingot {

void* scratch_buffer(CudaState& state, int64_t bytes, const char* op) {
  if (bytes <= state.scratch_bytes) return state.scratch;
  INGOT_CHECK(!state.capturing, op, ": needs ", bytes, " bytes of scratch but only ",
              state.scratch_bytes,
              " are allocated, and memory cannot be allocated during graph capture; run one "
              "step uncaptured first");
  // Earlier ops may still read the old buffer: wait for them before freeing it.
  INGOT_CUDA_CHECK(cudaStreamSynchronize(state.stream));
  if (state.scratch) INGOT_CUDA_CHECK(cudaFree(state.scratch));
  state.scratch = nullptr;
  state.scratch_bytes = 0;
  // Grow with slack so that a sequence of slightly larger requests does not reallocate often; at
  // most 64 MiB of it, since cuDNN's attention workspace alone can be gigabytes.
  const int64_t grown = bytes + std::min(bytes / 4, cuda::kScratchSlackBytes);
  state.scratch = cuda::device_alloc(grown);
  state.scratch_bytes = grown;
  ++state.scratch_generation;  // a captured graph holding the old address must be captured again
  return state.scratch;
}

void destroy_matmul_plan(MatmulPlan& plan) {
  if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
  if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
  if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
  if (plan.desc) cublasLtMatmulDescDestroy(plan.desc);
  plan = MatmulPlan{};
}

}  // namespace ingot

namespace ingot::cuda {

bool device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later calls start clean
    return false;
  }
  return count > 0;
}

namespace {
// Does nothing: asking for its attributes tells whether this build holds code for the device.
__global__ void device_code_probe_kernel() {}
}  // namespace

CudaState* create_state(int device_index) {
  int count = 0;
  INGOT_CUDA_CHECK(cudaGetDeviceCount(&count));
  INGOT_CHECK(device_index >= 0 && device_index < count, "CUDA device ", device_index,
              " requested but ", count, " present");
  INGOT_CUDA_CHECK(cudaSetDevice(device_index));
  auto* state = new CudaState();
  try {
    state->device = device_index;
    cudaDeviceProp prop{};
    INGOT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
    // A build without code for this GPU (the default is sm_90a: Hopper only) used to fail at its
    // first kernel, after the memory plan and the weight upload, naming whichever kernel that was.
    cudaFuncAttributes probe{};
    if (const cudaError_t image = cudaFuncGetAttributes(&probe, device_code_probe_kernel); image != cudaSuccess) {
      cudaGetLastError();
      fail("this build of Ingot holds CUDA code for ", INGOT_CUDA_ARCHITECTURES, " only, and CUDA device ",
           device_index, " (", prop.name, ") is sm_", prop.major, prop.minor, " (", cudaGetErrorString(image),
           "): rebuild in a fresh build folder with -DCMAKE_CUDA_ARCHITECTURES=", prop.major, prop.minor,
           // sm_90a, not sm_90: the wgmma attention kernels need the architecture-specific code.
           prop.major == 9 && prop.minor == 0 ? "a" : "",
           ", or train on the CPU (device: cpu)");
    }
    state->num_sms = prop.multiProcessorCount;
    state->max_smem_per_block = static_cast<int>(prop.sharedMemPerBlockOptin);
    INGOT_CUDA_CHECK(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking));
    state->wgmma_code = prop.major == 9 && prop.minor == 0 && attention_wgmma_code_loaded(state->stream);
    INGOT_CUBLAS_CHECK(cublasLtCreate(&state->cublaslt));
    state->workspace = device_alloc(kCublasLtWorkspaceBytes);
    state->workspace_bytes = kCublasLtWorkspaceBytes;
    const std::string tune = env_choice("INGOT_GEMM_TUNE", {"0", "report"});
    if (tune == "0") state->gemm_tuning = GemmTuning::first_choice;
    if (tune == "report") state->gemm_tuning = GemmTuning::timed_report;
  } catch (...) {
    destroy_state(state);
    throw;
  }
  return state;
}

void set_gemm_tuning(CudaState* state, bool timed) {
  INGOT_CHECK(state != nullptr, "set_gemm_tuning: no CUDA state");
  state->gemm_tuning = timed ? GemmTuning::timed : GemmTuning::first_choice;
}

void destroy_state(CudaState* state) {
  if (!state) return;
  // Best effort: destruction must not throw, and a failed call here has nothing left to save.
  if (state->stream) cudaStreamSynchronize(state->stream);
  for (auto& [key, plan] : state->matmul_plans) destroy_matmul_plan(plan);
  if (state->graph_exec) cudaGraphExecDestroy(state->graph_exec);
  if (state->graph) cudaGraphDestroy(state->graph);
  if (state->cublaslt) cublasLtDestroy(state->cublaslt);
  if (state->workspace) cudaFree(state->workspace);
  if (state->scratch) cudaFree(state->scratch);
  if (state->stream) cudaStreamDestroy(state->stream);
  delete state;
}

void* device_alloc(int64_t bytes) {
  INGOT_CHECK(bytes >= 0, "device_alloc: negative size ", bytes);
  if (bytes == 0) return nullptr;
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, static_cast<size_t>(bytes));
  if (status != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    fail("cudaMalloc of ", bytes, " bytes (", bytes / double(1 << 20), " MiB) failed: ",
         cudaGetErrorString(status), "; device has ", free_bytes / double(1 << 20),
         " MiB free of ", total_bytes / double(1 << 20), " MiB");
  }
  return ptr;
}

void device_free(void* ptr) {
  if (ptr) INGOT_CUDA_CHECK(cudaFree(ptr));
}

void copy_to_device(void* dst, const void* src, int64_t bytes, CudaState* state) {
  if (bytes == 0) return;
  cudaStream_t stream = state ? state->stream : nullptr;
  INGOT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream));
  INGOT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void copy_to_host(void* dst, const void* src, int64_t bytes, CudaState* state) {
  if (bytes == 0) return;
  cudaStream_t stream = state ? state->stream : nullptr;
  INGOT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream));
  INGOT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void* host_alloc_pinned(int64_t bytes) {
  INGOT_CHECK(bytes >= 0, "host_alloc_pinned: negative size ", bytes);
  void* ptr = nullptr;
  if (bytes > 0) INGOT_CUDA_CHECK(cudaHostAlloc(&ptr, static_cast<size_t>(bytes), cudaHostAllocDefault));
  return ptr;
}

void host_free_pinned(void* ptr) {
  if (ptr) cudaFreeHost(ptr);
}

void copy_to_device_async(void* dst, const void* src, int64_t bytes, CudaState* state) {
  if (bytes > 0)
    INGOT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                     state ? state->stream : nullptr));
}

void copy_to_host_async(void* dst, const void* src, int64_t bytes, CudaState* state) {
  if (bytes > 0)
    INGOT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                     state ? state->stream : nullptr));
}

void synchronize(CudaState* state) {
  if (state) INGOT_CUDA_CHECK(cudaStreamSynchronize(state->stream));
  else INGOT_CUDA_CHECK(cudaDeviceSynchronize());
}

int64_t device_memory_free() {
  size_t free_bytes = 0, total_bytes = 0;
  INGOT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

int64_t device_memory_total() {
  size_t free_bytes = 0, total_bytes = 0;
  INGOT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(total_bytes);
}

int64_t device_max_shared_memory_per_block() {
  int device = 0, bytes = 0;
  INGOT_CUDA_CHECK(cudaGetDevice(&device));
  INGOT_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

std::string device_name() {
  int device = 0;
  INGOT_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  INGOT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

int device_compute_capability() {
  int device = 0, major = 0, minor = 0;
  INGOT_CUDA_CHECK(cudaGetDevice(&device));
  INGOT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  INGOT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

std::string library_versions() {
  std::string s = "cuBLASLt " + std::to_string(cublasLtGetVersion());
#ifdef INGOT_CUDA_USE_CUDNN
  s += ", cuDNN " + std::to_string(cudnnGetVersion());
#else
  s += ", no cuDNN";
#endif
  return s;
}

int64_t scratch_generation(const CudaState* state) { return state ? state->scratch_generation : 0; }
int64_t scratch_bytes(const CudaState* state) { return state ? state->scratch_bytes : 0; }

void begin_capture(CudaState* state) {
  INGOT_CHECK(state && !state->capturing, "begin_capture: no state, or already capturing");
  // Global mode: any unsafe CUDA call from any thread during capture is an error, not a hang.
  INGOT_CUDA_CHECK(cudaStreamBeginCapture(state->stream, cudaStreamCaptureModeGlobal));
  state->capturing = true;
}

void end_capture_and_instantiate(CudaState* state) {
  INGOT_CHECK(state && state->capturing, "end_capture_and_instantiate: not capturing");
  state->capturing = false;
  cudaGraph_t graph = nullptr;
  INGOT_CUDA_CHECK(cudaStreamEndCapture(state->stream, &graph));
  if (state->graph_exec) INGOT_CUDA_CHECK(cudaGraphExecDestroy(state->graph_exec));
  if (state->graph) INGOT_CUDA_CHECK(cudaGraphDestroy(state->graph));
  state->graph = graph;
  state->graph_exec = nullptr;
  INGOT_CUDA_CHECK(cudaGraphInstantiate(&state->graph_exec, graph, 0));
}

void abort_capture(CudaState* state) {
  if (!state || !state->capturing) return;
  state->capturing = false;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(state->stream, &graph);  // fails when the capture was invalidated; either way it ended
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();
}

void replay(CudaState* state) {
  INGOT_CHECK(state && state->graph_exec, "replay: no captured graph");
  INGOT_CUDA_CHECK(cudaGraphLaunch(state->graph_exec, state->stream));
}

Event event_create() {
  cudaEvent_t event = nullptr;
  INGOT_CUDA_CHECK(cudaEventCreate(&event));
  return event;
}

void event_destroy(Event event) {
  if (event) INGOT_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}

void event_synchronize(Event event) {
  INGOT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

void event_record(Event event, CudaState* state) {
  INGOT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), state ? state->stream : nullptr));
}

float event_elapsed_ms(Event start, Event end) {
  INGOT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  float ms = 0;
  INGOT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

}  // namespace ingot::cuda
