// Causal GQA attention through cuDNN's fused flash-attention engines, built with the backend API
// (no cudnn-frontend). Contract: ops.h; dispatch rules and env switches: attention_cudnn.h.
//
// Why a composite graph and not CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR: in cuDNN 9.14-9.19
// the native SDPA forward op has no causal mask (masks arrive with its SUBGRAPH attribute in 9.21)
// and the native backward op exists only from 9.17 (the accelerator machine has 9.14). cuDNN's
// runtime-fusion engines recognise the classic attention graph instead, and run it as one fused
// flash-attention kernel:
//   forward   S = (Q K^T) * scale; causal select (row >= col, else lowest float);
//             M = rowmax S; E = exp(S - M); Z = rowsum E; lse = M + log Z; O = (E / Z) V
//   backward  Dsum = rowsum(dO * O); P = exp(select(scale Q K^T) - lse); dV = P^T dO;
//             dS = P * (dO V^T - Dsum) * scale; dK = dS^T Q; dQ = dS K
// GQA: K and V carry Hkv heads and the matmuls broadcast them over the group; dK and dV are
// computed per query head and reduced over the group by a reduction node (as the engine expects).
// The lse is the natural-log log-sum-exp of the scaled, masked scores: the ops.h contract as is.
//
// Layout: every tensor is a strided view of the packed storage, no copies. qkv (B,T,Htot,D) gives
// Q (B,Hq,T,D) with strides (T*Htot*D, D, Htot*D, 1), K^T (B,Hkv,D,T) with strides
// (T*Htot*D, D, 1, Htot*D), and so on; out/dout (B,T,Hq,D); lse (B,Hq,T) = stats (B,Hq,T,1).
//
// Plans: one graph + heuristics + execution plan per (direction, B, T, Hq, Hkv, D, variant),
// built on first use and kept for the process in a side cache with its own cuDNN handle (the
// handle's stream is set to the caller's stream before each execute), so plans outlive any one
// CudaState. Workspace (and the backward's f32 dQ accumulator) come from CudaState's scratch.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ingot/core/env.h"
#include "ingot/ops/cuda/attention_cudnn.h"
#include "ingot/ops/cuda/attention_documents.h"
#include "ingot/ops/cuda/attention_mma.h"
#include "ingot/ops/cuda/common.cuh"

namespace ingot::cuda {

namespace {
thread_local const char* g_last_path = "none";
}

const char* attention_last_path() { return g_last_path; }
void attention_set_last_path(const char* path) { g_last_path = path; }

namespace {
std::atomic<int64_t> g_cudnn_backward_workspace_limit{std::numeric_limits<int64_t>::max()};
}

void set_cudnn_backward_workspace_limit(int64_t bytes) { g_cudnn_backward_workspace_limit = bytes; }
int64_t cudnn_backward_workspace_limit() {
  const int64_t limit = g_cudnn_backward_workspace_limit.load();
  const char* env = std::getenv("INGOT_ATTENTION_WORKSPACE_MIB");
  if (!env || !*env) return limit;
  char* end = nullptr;
  const long long mib = std::strtoll(env, &end, 10);
  if (*end != '\0' || mib < 0)
    fail("INGOT_ATTENTION_WORKSPACE_MIB must be a whole number of MiB (0 or more), got \"", env, "\"");
  if (mib > (std::numeric_limits<int64_t>::max() >> 20)) return limit;
  return std::min(limit, int64_t(mib) << 20);
}

namespace {
// The shape half of the documents path's checks (documents_eligible adds dtypes, alignment and
// the tensor-core forward's shared memory): the tensor-core forward's head dims and grid, T within
// the table builder's reach, and element offsets into qkv and cuDNN's dense stats that fit int32.
bool documents_take_shapes(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  return attention_mma_takes_shapes(B, Hq, D) && T <= kDocumentTableMaxT &&
         B * T * (Hq + 2 * Hkv) * D < (int64_t(1) << 31) &&
         document_slots(int(B), int(T)) * Hq * T < (int64_t(1) << 31);
}
}  // namespace

AttentionKernels attention_kernels_for(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, bool packed_rows) {
  const AttentionMode mode = attention_mode();
  const bool cudnn = attention_cudnn_compiled() && mode != AttentionMode::kernels && mode != AttentionMode::mma &&
                     D % 8 == 0 && D <= 128 && (!packed_rows || documents_take_shapes(B, T, Hq, Hkv, D));
  if (cudnn) return AttentionKernels::cudnn;
  return mode != AttentionMode::kernels && attention_mma_takes_shapes(B, Hq, D) ? AttentionKernels::tensor_cores
                                                                                : AttentionKernels::cuda_cores;
}

int64_t attention_scratch_estimate(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, bool packed_rows,
                                   bool bf16, int64_t cudnn_workspace_limit) {
  const int64_t rows = B * Hq * T;
  const int64_t kernels = rows * 4 + attention_mma_forward_scratch_bytes(B, T);  // delta f32, tile ranges
  if (!bf16 || attention_kernels_for(B, T, Hq, Hkv, D, packed_rows) != AttentionKernels::cudnn) return kernels;
  if (packed_rows)  // the documents forward: table, dense stats, tile ranges (its plan needs no workspace)
    return std::max(kernels, document_table_bytes(int(B), int(T)) + document_stats_bytes(int(B), int(T), Hq) +
                                 attention_mma_forward_scratch_bytes(B, T));
  // The fast variant keeps no T x T matrix and always runs as one call (attention_cudnn_backward),
  // whatever the limit: its f32 (B, Hq, T, D) dQ accumulator is its whole workspace.
  if (attention_mode() == AttentionMode::cudnn_fast) return std::max(kernels, rows * D * 4 + kCudnnWorkspaceMarginBytes);
  const CudnnBackwardSplit split = cudnn_backward_split(B, T, Hq, Hkv, cudnn_workspace_limit);
  if (!split.fits()) return kernels;
  // One slice's workspace: the slices run one after another in the same scratch.
  return std::max(kernels, cudnn_backward_charge_bytes(split.rows, T, split.kv_heads * (Hq / Hkv), D));
}

AttentionMode attention_mode() {
  const std::string mode = env_choice("INGOT_ATTENTION", {"cudnn-fast", "mma", "kernels"});
  if (mode == "cudnn-fast") return AttentionMode::cudnn_fast;
  if (mode == "mma") return AttentionMode::mma;
  if (mode == "kernels") return AttentionMode::kernels;
  return AttentionMode::automatic;
}

void check_attention_switches() {
  (void)attention_mode();
  (void)env_flag("INGOT_ATTENTION_MMA_SYNC");
  (void)env_flag("INGOT_ATTENTION_REPORT");
  (void)cudnn_backward_workspace_limit();
}

#ifndef INGOT_CUDA_USE_CUDNN

bool attention_cudnn_compiled() { return false; }
int64_t attention_cudnn_backward_workspace(Context&, int64_t, int64_t, int64_t, int64_t, int64_t) { return -1; }
bool attention_cudnn_forward(Context&, Tensor, Tensor, Tensor, Tensor, int, int, double) { return false; }
bool attention_cudnn_backward(Context&, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int, int,
                              double) {
  return false;
}
bool attention_cudnn_documents_forward(Context&, Tensor, Tensor, Tensor, Tensor, int, int, double) {
  return false;
}


#else

bool attention_cudnn_compiled() { return true; }

namespace {

enum class Variant { fast, deterministic };

// "kernels" and "mma" ask for one of Ingot's own kernel families instead of cuDNN.
bool cudnn_declined_by_env() {
  const AttentionMode mode = attention_mode();
  return mode == AttentionMode::kernels || mode == AttentionMode::mma;
}
// Deterministic unless asked otherwise: bitwise-reproducible steps are an engine invariant.
Variant requested_variant() {
  return attention_mode() == AttentionMode::cudnn_fast ? Variant::fast : Variant::deterministic;
}

// Tensor unique ids of the non-virtual tensors (the variant pack binds these).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV, kdQAccum, kScale, kLowest, kOne,
  kQkvOffset, kOutOffset, kSeqLen,  // documents (attention_documents.h)
  kFirstVirtual = 100,
};

struct TensorRef {
  cudnnBackendDescriptor_t desc = nullptr;
  int64_t uid = 0;
};

using Dims = std::array<int64_t, 4>;

Dims contiguous(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// Builds one operation graph and its execution plan. Owns every descriptor it creates; the
// first failing call records why and turns the rest into no-ops.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}
  ~GraphBuilder() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it)
      if (*it) cudnnBackendDestroyDescriptor(*it);
  }
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  // Hands over the plan (and with it nothing else: cuDNN plans keep what they need).
  cudnnBackendDescriptor_t release_plan() {
    cudnnBackendDescriptor_t p = plan_;
    for (auto& d : owned_)
      if (d == p) d = nullptr;
    plan_ = nullptr;
    return p;
  }
  int64_t workspace_bytes() const { return workspace_bytes_; }

  // ragged_offset: (batch + 1) element offsets of each batch entry's start, which replace the
  // batch stride (variable-length sequences).
  TensorRef tensor(int64_t uid, cudnnDataType_t dtype, const Dims& dims, const Dims& strides,
                   bool is_virtual, bool by_value = false, bool reorder_f16x16 = false,
                   const TensorRef* ragged_offset = nullptr) {
    TensorRef t;
    t.uid = uid;
    t.desc = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    const int64_t alignment = 16;
    set(t.desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t.desc, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
    set(t.desc, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t.desc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t.desc, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    set(t.desc, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(t.desc, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    if (reorder_f16x16) {
      const cudnnBackendTensorReordering_t mode = CUDNN_TENSOR_REORDERING_F16x16;
      set(t.desc, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &mode);
    }
    if (ragged_offset)
      set(t.desc, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ragged_offset->desc);
    finalize(t.desc, "tensor");
    return t;
  }
  TensorRef virtual_tensor(cudnnDataType_t dtype, const Dims& dims) {
    return tensor(next_virtual_++, dtype, dims, contiguous(dims), true);
  }
  TensorRef virtual_tensor(cudnnDataType_t dtype, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, dtype, dims, strides, true);
  }
  TensorRef scalar(int64_t uid) {  // f32 passed by value
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b[, t]]); axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, const TensorRef& x,
                 const TensorRef* b, const TensorRef* t, const TensorRef& y, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->desc);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t->desc);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    finalize(op, "pointwise op");
    ops_.push_back(op);
  }
  TensorRef pointwise_new(cudnnPointwiseMode_t mode, cudnnDataType_t math, const TensorRef& x,
                          const TensorRef* b, const TensorRef* t, cudnnDataType_t y_dtype,
                          const Dims& y_dims, int64_t axis = -1) {
    TensorRef y = virtual_tensor(y_dtype, y_dims);
    pointwise(mode, math, x, b, t, y, axis);
    return y;
  }

  // c (M x N) = a (M x K) b (K x N) per batch entry; m, n, k: optional (batch,1,1,1) int32 tensors
  // that bound M, N, K per entry (variable-length sequences).
  void matmul(const TensorRef& a, const TensorRef& b, const TensorRef& c, const TensorRef* m = nullptr,
              const TensorRef* n = nullptr, const TensorRef* k = nullptr) {
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(mm, "matmul descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.desc);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.desc);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.desc);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    if (m) set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m->desc);
    if (n) set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n->desc);
    if (k) set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k->desc);
    finalize(op, "matmul op");
    ops_.push_back(op);
  }

  void reduction(cudnnReduceTensorOp_t mode, const TensorRef& x, const TensorRef& y) {
    cudnnBackendDescriptor_t rd = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(rd, "reduction descriptor");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    finalize(op, "reduction op");
    ops_.push_back(op);
  }

  void reshape(const TensorRef& x, const TensorRef& y) {
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    finalize(op, "reshape op");
    ops_.push_back(op);
  }

  // Operation graph -> heuristics (mode A, then fallback) -> the first config whose plan
  // finalizes. With INGOT_ATTENTION_REPORT=1, every config the heuristics offer (engine and knob
  // choices) and the one taken are printed, labelled with `what`.
  void build_plan(const std::string& what) {
    if (!ok()) return;
    cudnnBackendDescriptor_t graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()),
        ops_.data());
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    finalize(graph, "operation graph");
    std::string reasons;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      if (!ok() || plan_) break;
      cudnnBackendDescriptor_t heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
      set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
      set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
      if (!ok()) break;
      if (cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS) {
        reasons += " heuristics mode " + std::to_string(int(mode)) + ": " + last_error() + ";";
        continue;
      }
      int64_t count = 0;
      if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   0, &count, nullptr) != CUDNN_STATUS_SUCCESS || count <= 0) {
        reasons += " heuristics mode " + std::to_string(int(mode)) + " offered no engine;";
        continue;
      }
      std::vector<cudnnBackendDescriptor_t> configs(static_cast<size_t>(count));
      for (auto& c : configs) c = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
      if (!ok()) break;
      int64_t got = 0;
      if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                   count, &got, configs.data()) != CUDNN_STATUS_SUCCESS) {
        reasons += " reading heuristics results failed;";
        continue;
      }
      const bool report = env_flag("INGOT_ATTENTION_REPORT");
      if (report) {
        std::fprintf(stderr, "[cudnn] %s: heuristics mode %s offers %ld configs\n", what.c_str(),
                     mode == CUDNN_HEUR_MODE_A ? "A" : "fallback", long(got));
        for (int64_t i = 0; i < got; ++i)
          std::fprintf(stderr, "[cudnn]   #%ld %s\n", long(i), describe(configs[i]).c_str());
      }
      for (int64_t i = 0; i < got && !plan_; ++i) {
        cudnnBackendDescriptor_t plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "plan");
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]);
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
        if (!ok()) break;
        if (cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS) {
          plan_ = plan;
          if (report) std::fprintf(stderr, "[cudnn]   chosen #%ld\n", long(i)), std::fflush(stderr);
        } else {
          reasons += " config " + std::to_string(i) + ": " + last_error() + ";";
        }
      }
    }
    if (ok() && !plan_) error_ = "no engine config finalized:" + reasons;
    if (ok() && cudnnBackendGetAttribute(plan_, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                         CUDNN_TYPE_INT64, 1, nullptr, &workspace_bytes_) !=
                    CUDNN_STATUS_SUCCESS)
      error_ = "reading the plan's workspace size failed";
    if (ok() && env_flag("INGOT_ATTENTION_REPORT"))
      std::fprintf(stderr, "[cudnn] %s: workspace %.1f MiB\n", what.c_str(), double(workspace_bytes_) / (1 << 20));
  }

 private:
  // "engine <global index>, knobs <type>=<value> ..." of an engine config (knob types are
  // cudnnBackendKnobType_t values, e.g. 24 = CUDNN_KNOB_TYPE_KERNEL_CFG). Report only: its
  // descriptors live outside the builder, so a failure here cannot change the plan.
  static std::string describe(cudnnBackendDescriptor_t config) {
    constexpr int64_t kMaxKnobs = CUDNN_KNOB_TYPE_COUNTS;  // at most one choice per knob type
    std::vector<cudnnBackendDescriptor_t> owned;
    struct Release {
      std::vector<cudnnBackendDescriptor_t>& d;
      ~Release() {
        for (auto x : d) cudnnBackendDestroyDescriptor(x);
      }
    } release{owned};
    auto make = [&](cudnnBackendDescriptorType_t type) {
      cudnnBackendDescriptor_t d = nullptr;
      if (cudnnBackendCreateDescriptor(type, &d) != CUDNN_STATUS_SUCCESS) return false;
      owned.push_back(d);
      return true;
    };
    if (!make(CUDNN_BACKEND_ENGINE_DESCRIPTOR)) return "(cannot describe)";
    for (int64_t k = 0; k < kMaxKnobs; ++k)
      if (!make(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)) return "(cannot describe)";
    cudnnBackendDescriptor_t engine = owned[0];
    cudnnBackendDescriptor_t* choices = owned.data() + 1;
    int64_t n = 0, index = -1, knobs = 0;
    cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine);
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
    cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxKnobs,
                             &knobs, choices);
    std::string text = "engine " + std::to_string(index) + ", knobs";
    for (int64_t k = 0; k < std::min(knobs, kMaxKnobs); ++k) {
      cudnnBackendKnobType_t type{};
      int64_t value = 0;
      cudnnBackendGetAttribute(choices[k], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &n, &type);
      cudnnBackendGetAttribute(choices[k], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &n, &value);
      text += " " + std::to_string(int(type)) + "=" + std::to_string(value);
    }
    return text;
  }
  static std::string last_error() {
    char message[512] = {0};
    cudnnGetLastErrorString(message, sizeof(message));
    return message[0] ? std::string(message) : std::string("(no message)");
  }
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type, const char* what) {
    if (!ok()) return nullptr;
    cudnnBackendDescriptor_t d = nullptr;
    const cudnnStatus_t s = cudnnBackendCreateDescriptor(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
      error_ = std::string("creating ") + what + ": " + cudnnGetErrorString(s);
      return nullptr;
    }
    owned_.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    if (!ok()) return;
    const cudnnStatus_t s = cudnnBackendSetAttribute(d, name, type, count, values);
    if (s != CUDNN_STATUS_SUCCESS)
      error_ = "setting attribute " + std::to_string(int(name)) + ": " + cudnnGetErrorString(s) +
               " " + last_error();
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (!ok()) return;
    const cudnnStatus_t s = cudnnBackendFinalize(d);
    if (s != CUDNN_STATUS_SUCCESS)
      error_ = std::string("finalizing ") + what + ": " + cudnnGetErrorString(s) + " " + last_error();
  }

  cudnnHandle_t handle_;
  std::vector<cudnnBackendDescriptor_t> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  cudnnBackendDescriptor_t plan_ = nullptr;
  int64_t workspace_bytes_ = 0;
  int64_t next_virtual_ = kFirstVirtual;
  std::string error_;
};

// documents: B counts documents (slots of attention_documents.h), not rows; each starts where its
// ragged offset says, T bounds its length and the padding mask cuts it to its seq_len.
// A slice of the heads (the split backward) keeps the strides of the whole tensors: stored_Hq and
// stored_Hkv are the heads the storage holds, Hq and Hkv the heads this graph computes.
struct Geometry {
  int64_t B, T, Hq, Hkv, D;
  bool documents = false;
  int64_t stored_Hq = Hq, stored_Hkv = Hkv;
  int64_t stored_Htot() const { return stored_Hq + 2 * stored_Hkv; }  // heads a token of the storage holds
  // Q/K/V (and dQ/dK/dV) heads inside packed (B,T,Htot,D): (B,H,T,D) view.
  Dims packed_strides() const { return {T * stored_Htot() * D, D, stored_Htot() * D, 1}; }
  // K^T / V^T: (B,Hkv,D,T) view of the same storage.
  Dims packed_transposed_strides() const { return {T * stored_Htot() * D, D, 1, stored_Htot() * D}; }
  // out / dout (B,T,Hq,D) as (B,Hq,T,D).
  Dims out_strides() const { return {T * stored_Hq * D, D, stored_Hq * D, 1}; }
  // lse (B,Hq,T) as stats (B,Hq,T,1).
  Dims stats_strides() const { return {stored_Hq * T, T, 1, 1}; }
  std::string describe() const {
    std::string text = std::string(documents ? "documents=" : "B=") + std::to_string(B) + " T=" + std::to_string(T) +
                       " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D);
    if (Hq != stored_Hq) text += " of Hq=" + std::to_string(stored_Hq) + " Hkv=" + std::to_string(stored_Hkv);
    return text;
  }
};

const cudnnDataType_t kF32 = CUDNN_DATA_FLOAT, kBf16 = CUDNN_DATA_BFLOAT16,
                      kI32 = CUDNN_DATA_INT32, kBool = CUDNN_DATA_BOOLEAN;

// S (B,Hq,T,T) -> S with keys after the query replaced by the lowest float.
TensorRef causal_select(GraphBuilder& g, const TensorRef& s, const TensorRef& lowest, const Dims& sdims) {
  TensorRef row = g.pointwise_new(CUDNN_POINTWISE_GEN_INDEX, kI32, s, nullptr, nullptr, kI32, sdims, 2);
  TensorRef col = g.pointwise_new(CUDNN_POINTWISE_GEN_INDEX, kI32, s, nullptr, nullptr, kI32, sdims, 3);
  TensorRef keep = g.pointwise_new(CUDNN_POINTWISE_CMP_GE, kBool, row, &col, nullptr, kBool, sdims);
  return g.pointwise_new(CUDNN_POINTWISE_BINARY_SELECT, kF32, s, &lowest, &keep, kF32, sdims);
}

// S (B,Hq,T,T) -> S with entries outside the document (row or column >= seq_len) replaced by the
// lowest float.
TensorRef padding_select(GraphBuilder& g, const TensorRef& s, const TensorRef& seq_len,
                         const TensorRef& lowest, const Dims& sdims) {
  TensorRef row = g.pointwise_new(CUDNN_POINTWISE_GEN_INDEX, kI32, s, nullptr, nullptr, kI32, sdims, 2);
  TensorRef col = g.pointwise_new(CUDNN_POINTWISE_GEN_INDEX, kI32, s, nullptr, nullptr, kI32, sdims, 3);
  TensorRef row_in = g.pointwise_new(CUDNN_POINTWISE_CMP_LT, kBool, row, &seq_len, nullptr, kBool, sdims);
  TensorRef col_in = g.pointwise_new(CUDNN_POINTWISE_CMP_LT, kBool, col, &seq_len, nullptr, kBool, sdims);
  TensorRef keep = g.pointwise_new(CUDNN_POINTWISE_LOGICAL_AND, kBool, row_in, &col_in, nullptr, kBool, sdims);
  return g.pointwise_new(CUDNN_POINTWISE_BINARY_SELECT, kF32, s, &lowest, &keep, kF32, sdims);
}

// The documents' extra inputs: ragged offsets into qkv (and dqkv) and into out (and dout), and
// each document's length, which bounds every matmul and masks the scores. Absent for whole rows.
struct DocumentInputs {
  TensorRef qkv_offset, out_offset, seq_len;
  bool present = false;
  const TensorRef* qkv() const { return present ? &qkv_offset : nullptr; }
  const TensorRef* out() const { return present ? &out_offset : nullptr; }
  const TensorRef* len() const { return present ? &seq_len : nullptr; }
};
DocumentInputs document_inputs(GraphBuilder& g, const Geometry& s) {
  DocumentInputs d;
  if (!s.documents) return d;
  d.present = true;
  const Dims offsets{s.B + 1, 1, 1, 1}, lengths{s.B, 1, 1, 1};
  d.qkv_offset = g.tensor(kQkvOffset, kI32, offsets, contiguous(offsets), false);
  d.out_offset = g.tensor(kOutOffset, kI32, offsets, contiguous(offsets), false);
  d.seq_len = g.tensor(kSeqLen, kI32, lengths, contiguous(lengths), false);
  return d;
}

void build_forward(GraphBuilder& g, const Geometry& s) {
  const Dims qdims{s.B, s.Hq, s.T, s.D}, kvdims_t{s.B, s.Hkv, s.D, s.T}, vdims{s.B, s.Hkv, s.T, s.D};
  const Dims sdims{s.B, s.Hq, s.T, s.T}, rowdims{s.B, s.Hq, s.T, 1};
  const DocumentInputs docs = document_inputs(g, s);
  TensorRef q = g.tensor(kQ, kBf16, qdims, s.packed_strides(), false, false, false, docs.qkv());
  TensorRef kt = g.tensor(kK, kBf16, kvdims_t, s.packed_transposed_strides(), false, false, false, docs.qkv());
  TensorRef v = g.tensor(kV, kBf16, vdims, s.packed_strides(), false, false, false, docs.qkv());
  TensorRef o = g.tensor(kO, kBf16, qdims, s.out_strides(), false, false, false, docs.out());
  TensorRef stats = g.tensor(kStats, kF32, rowdims, s.stats_strides(), false);  // dense even for documents
  TensorRef scale = g.scalar(kScale), lowest = g.scalar(kLowest);

  TensorRef scores = g.virtual_tensor(kF32, sdims);
  g.matmul(q, kt, scores, docs.len(), docs.len());
  TensorRef scaled = g.pointwise_new(CUDNN_POINTWISE_MUL, kF32, scores, &scale, nullptr, kF32, sdims);
  TensorRef in_document = docs.present ? padding_select(g, scaled, docs.seq_len, lowest, sdims) : scaled;
  TensorRef masked = causal_select(g, in_document, lowest, sdims);
  TensorRef row_max = g.virtual_tensor(kF32, rowdims);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  TensorRef centred = g.pointwise_new(CUDNN_POINTWISE_SUB, kF32, masked, &row_max, nullptr, kF32, sdims);
  TensorRef e = g.pointwise_new(CUDNN_POINTWISE_EXP, kF32, centred, nullptr, nullptr, kF32, sdims);
  TensorRef z = g.virtual_tensor(kF32, rowdims);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  TensorRef log_z = g.pointwise_new(CUDNN_POINTWISE_LOG, kF32, z, nullptr, nullptr, kF32, rowdims);
  g.pointwise(CUDNN_POINTWISE_ADD, kF32, row_max, &log_z, nullptr, stats);
  TensorRef p = g.pointwise_new(CUDNN_POINTWISE_DIV, kF32, e, &z, nullptr, kBf16, sdims);
  g.matmul(p, v, o, docs.len(), nullptr, docs.len());
  g.build_plan("forward " + s.describe());
}

void build_backward(GraphBuilder& g, const Geometry& s, Variant variant) {
  const bool gqa = s.Hq != s.Hkv;
  const Dims qdims{s.B, s.Hq, s.T, s.D}, kvdims_t{s.B, s.Hkv, s.D, s.T}, kvdims{s.B, s.Hkv, s.T, s.D};
  const Dims sdims{s.B, s.Hq, s.T, s.T}, rowdims{s.B, s.Hq, s.T, 1};
  const Dims transposed_s{s.Hq * s.T * s.T, s.T * s.T, 1, s.T};  // (B,Hq,Tk,Tq) view of S
  TensorRef q = g.tensor(kQ, kBf16, qdims, s.packed_strides(), false);
  TensorRef kt = g.tensor(kK, kBf16, kvdims_t, s.packed_transposed_strides(), false);
  TensorRef vt = g.tensor(kV, kBf16, kvdims_t, s.packed_transposed_strides(), false);
  TensorRef o = g.tensor(kO, kBf16, qdims, s.out_strides(), false);
  TensorRef dout = g.tensor(kdO, kBf16, qdims, s.out_strides(), false);
  TensorRef stats = g.tensor(kStats, kF32, rowdims, s.stats_strides(), false);
  TensorRef dq = g.tensor(kdQ, kBf16, qdims, s.packed_strides(), false);
  TensorRef dk = g.tensor(kdK, kBf16, kvdims, s.packed_strides(), false);
  TensorRef dv = g.tensor(kdV, kBf16, kvdims, s.packed_strides(), false);
  TensorRef scale = g.scalar(kScale), lowest = g.scalar(kLowest), one = g.scalar(kOne);

  // Dsum = rowsum(dO * O)
  TensorRef d_o = g.pointwise_new(CUDNN_POINTWISE_MUL, kF32, dout, &o, nullptr, kF32, qdims);
  TensorRef dsum0 = g.virtual_tensor(kF32, rowdims);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o, dsum0);
  TensorRef dsum = g.pointwise_new(CUDNN_POINTWISE_MUL, kF32, dsum0, &one, nullptr, kF32, rowdims);

  // P = exp(select(scale * Q K^T) - lse)
  TensorRef scores = g.virtual_tensor(kF32, sdims);
  g.matmul(q, kt, scores);
  TensorRef scaled = g.pointwise_new(CUDNN_POINTWISE_MUL, kF32, scores, &scale, nullptr, kF32, sdims);
  TensorRef masked = causal_select(g, scaled, lowest, sdims);
  TensorRef centred = g.pointwise_new(CUDNN_POINTWISE_SUB, kF32, masked, &stats, nullptr, kF32, sdims);
  TensorRef p = g.pointwise_new(CUDNN_POINTWISE_EXP, kF32, centred, nullptr, nullptr, kF32, sdims);

  // dV = P^T dO (summed over the query heads of a group for GQA)
  TensorRef pt = g.virtual_tensor(kBf16, {s.B, s.Hq, s.T, s.T}, transposed_s);
  g.reshape(p, pt);
  if (!gqa) {
    g.matmul(pt, dout, dv);
  } else {
    TensorRef dv_heads = g.virtual_tensor(kBf16, qdims);
    g.matmul(pt, dout, dv_heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_heads, dv);
  }

  // dS = P * (dO V^T - Dsum) * scale
  TensorRef dp = g.virtual_tensor(kF32, sdims);
  g.matmul(dout, vt, dp);
  TensorRef dp1 = g.pointwise_new(CUDNN_POINTWISE_MUL, kF32, dp, &one, nullptr, kF32, sdims);
  TensorRef dp2 = g.pointwise_new(CUDNN_POINTWISE_SUB, kF32, dp1, &dsum, nullptr, kF32, sdims);
  TensorRef ds0 = g.pointwise_new(CUDNN_POINTWISE_MUL, kF32, dp2, &p, nullptr, kF32, sdims);
  TensorRef ds = g.pointwise_new(CUDNN_POINTWISE_MUL, kF32, ds0, &scale, nullptr, kF32, sdims);

  // dK = dS^T Q
  TensorRef dst = g.virtual_tensor(kBf16, {s.B, s.Hq, s.T, s.T}, transposed_s);
  g.reshape(ds, dst);
  if (!gqa) {
    g.matmul(dst, q, dk);
  } else {
    TensorRef dk_heads = g.virtual_tensor(kBf16, qdims);
    g.matmul(dst, q, dk_heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_heads, dk);
  }

  // dQ = dS K: through an f32 accumulator (atomics) or straight into dQ (deterministic).
  const Dims kt_strides = s.packed_transposed_strides();
  TensorRef k = g.virtual_tensor(kF32, kvdims, {kt_strides[0], kt_strides[1], kt_strides[3], kt_strides[2]});
  g.reshape(kt, k);
  if (variant == Variant::deterministic) {
    g.matmul(ds, k, dq);
  } else {
    TensorRef accum = g.tensor(kdQAccum, kF32, qdims, contiguous(qdims), false, false, true);
    g.matmul(ds, k, accum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, kF32, accum, nullptr, nullptr, dq);
  }
  g.build_plan(std::string(variant == Variant::fast ? "backward (fast) " : "backward ") + s.describe());
}

struct Plan {
  cudnnBackendDescriptor_t plan = nullptr;  // null: cuDNN rejected this shape
  int64_t workspace_bytes = 0;
  int64_t accum_bytes = 0;                  // backward, fast variant: f32 dQ accumulator
};

// Process-wide: one handle per device and the plans built on it. Never destroyed (plans must
// outlive every CudaState that uses them; the OS reclaims them at exit).
struct Cache {
  std::mutex mutex;
  std::map<int, cudnnHandle_t> handles;
  std::map<std::array<int64_t, 11>, Plan> plans;
};
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

// The plan for key, built on first use; plan == null when cuDNN cannot run it.
const Plan& plan_for(CudaState& state, bool backward, const Geometry& s, Variant variant,
                     cudnnHandle_t* handle_out) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  cudnnHandle_t& handle = c.handles[state.device];
  if (!handle) {
    const cudnnStatus_t st = cudnnCreate(&handle);
    if (st != CUDNN_STATUS_SUCCESS) fail("cuDNN error: cudnnCreate failed: ", cudnnGetErrorString(st));
  }
  *handle_out = handle;
  const std::array<int64_t, 11> key{int64_t(state.device), backward ? 1 : 0, int64_t(variant),
                                    s.B, s.T, s.Hq, s.Hkv, s.D, s.documents ? 1 : 0, s.stored_Hq, s.stored_Hkv};
  auto it = c.plans.find(key);
  if (it != c.plans.end()) return it->second;
  INGOT_CHECK(!state.capturing, "attention (cuDNN): no plan for this shape yet, and a plan cannot be "
              "built during graph capture; run one step uncaptured first");
  Plan plan;
  GraphBuilder g(handle);
  if (backward) build_backward(g, s, variant);
  else build_forward(g, s);
  if (g.ok()) {
    plan.plan = g.release_plan();
    plan.workspace_bytes = g.workspace_bytes();
    if (backward && variant == Variant::fast) plan.accum_bytes = s.B * s.Hq * s.T * s.D * int64_t(sizeof(float));
    // The memory plan charged what cuDNN 9.14 asks for. A version that asks for more still runs
    // (the scratch grows at the first, uncaptured step), but past the plan's check of free memory.
    const int64_t charged =
        backward && variant == Variant::deterministic ? cudnn_backward_charge_bytes(s.B, s.T, s.Hq, s.D) : -1;
    if (charged >= 0 && plan.workspace_bytes > charged)
      std::fprintf(stderr,
                   "ingot: warning: cuDNN %zu's attention backward (%s) asks for %.1f MiB of workspace, more than "
                   "the %.1f MiB the memory plan charged it (measured with cuDNN 9.14): a run that the plan "
                   "barely fits may run out of device memory at its first step\n",
                   size_t(cudnnGetVersion()), s.describe().c_str(), double(plan.workspace_bytes) / (1 << 20),
                   double(charged) / (1 << 20));
  } else {
    std::fprintf(stderr,
                 "ingot: cuDNN attention %s (%s%s) unavailable, using %s: %s\n",
                 backward ? "backward" : "forward", s.describe().c_str(),
                 backward && variant == Variant::fast ? ", fast" : "",
                 s.documents ? "the tensor-core kernels for every document" : "Ingot's own kernels",
                 g.error().c_str());
  }
  return c.plans.emplace(key, plan).first->second;
}

int64_t align256(int64_t n) { return (n + 255) / 256 * 256; }

// Bytes of scratch the plan uses (after whatever the caller keeps at its start).
int64_t plan_scratch_bytes(const Plan& plan) { return align256(plan.accum_bytes) + plan.workspace_bytes; }

// Binds pointers and runs the plan on the state's stream. The plan's scratch starts
// scratch_offset bytes into the scratch buffer.
void execute(CudaState& state, cudnnHandle_t handle, const Plan& plan, std::vector<int64_t> uids,
             std::vector<void*> pointers, const char* op, int64_t scratch_offset = 0) {
  void* scratch = plan_scratch_bytes(plan) > 0
                      ? static_cast<char*>(scratch_buffer(state, scratch_offset + plan_scratch_bytes(plan), op)) +
                            scratch_offset
                      : nullptr;
  void* workspace = plan.workspace_bytes > 0 ? static_cast<char*>(scratch) + align256(plan.accum_bytes) : nullptr;
  if (plan.accum_bytes > 0) {
    INGOT_CUDA_CHECK(cudaMemsetAsync(scratch, 0, size_t(plan.accum_bytes), state.stream));
    uids.push_back(kdQAccum);
    pointers.push_back(scratch);
  }
  cudnnStatus_t st = cudnnSetStream(handle, state.stream);
  if (st != CUDNN_STATUS_SUCCESS) fail(op, ": cudnnSetStream failed: ", cudnnGetErrorString(st));
  cudnnBackendDescriptor_t pack = nullptr;
  st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st != CUDNN_STATUS_SUCCESS) fail(op, ": creating the variant pack failed: ", cudnnGetErrorString(st));
  struct Destroy {
    cudnnBackendDescriptor_t d;
    ~Destroy() { cudnnBackendDestroyDescriptor(d); }
  } destroy{pack};
  const int64_t n = int64_t(uids.size());
  if ((st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data())) != CUDNN_STATUS_SUCCESS ||
      (st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, pointers.data())) != CUDNN_STATUS_SUCCESS ||
      (st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)) != CUDNN_STATUS_SUCCESS ||
      (st = cudnnBackendFinalize(pack)) != CUDNN_STATUS_SUCCESS)
    fail(op, ": building the variant pack failed: ", cudnnGetErrorString(st));
  st = cudnnBackendExecute(handle, plan.plan, pack);
  if (st != CUDNN_STATUS_SUCCESS) {
    char message[512] = {0};
    cudnnGetLastErrorString(message, sizeof(message));
    fail(op, ": cudnnBackendExecute failed: ", cudnnGetErrorString(st), " ", message);
  }
}

bool eligible(const Tensor& segment_ids, const Tensor& qkv, std::initializer_list<const Tensor*> others,
              int64_t D) {
  if (cudnn_declined_by_env() || segment_ids.present()) return false;
  if (qkv.dtype != DType::bf16 || D % 8 != 0 || D > 128) return false;
  if (!aligned16(qkv.data)) return false;
  for (const Tensor* t : others)
    if (t->dtype != DType::bf16 && t->dtype != DType::f32) return false;
  for (const Tensor* t : others)
    if (!aligned16(t->data)) return false;
  return true;
}

Geometry geometry_of(const Tensor& qkv, int n_q_heads, int n_kv_heads) {
  return {qkv.dim(0), qkv.dim(1), n_q_heads, n_kv_heads, qkv.dim(3)};
}

}  // namespace

int64_t attention_cudnn_backward_workspace(Context& ctx, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  CudaState& state = state_of(ctx, "attention_cudnn_backward_workspace");
  cudnnHandle_t handle = nullptr;
  const Plan& plan = plan_for(state, true, Geometry{B, T, Hq, Hkv, D}, Variant::deterministic, &handle);
  return plan.plan ? plan.workspace_bytes : -1;
}

bool attention_cudnn_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                             int n_q_heads, int n_kv_heads, double scale) {
  constexpr const char* op = "attention_forward (cuDNN)";
  const Geometry s = geometry_of(qkv, n_q_heads, n_kv_heads);
  if (!eligible(segment_ids, qkv, {&out, &lse}, s.D) || out.dtype != DType::bf16) return false;
  CudaState& state = state_of(ctx, op);
  cudnnHandle_t handle = nullptr;
  const Plan& plan = plan_for(state, false, s, Variant::fast, &handle);
  if (!plan.plan) return false;
  bf16* base = qkv.ptr<bf16>();
  float scale_f = float(scale), lowest = std::numeric_limits<float>::lowest();
  execute(state, handle, plan, {kQ, kK, kV, kO, kStats, kScale, kLowest},
          {base, base + s.Hq * s.D, base + (s.Hq + s.Hkv) * s.D, out.data, lse.data, &scale_f, &lowest}, op);
  attention_set_last_path("cudnn");
  return true;
}

bool attention_cudnn_backward(Context& ctx, Tensor dqkv, Tensor dout, Tensor out, Tensor lse,
                              Tensor qkv, Tensor segment_ids, int n_q_heads, int n_kv_heads,
                              double scale) {
  constexpr const char* op = "attention_backward (cuDNN)";
  const Geometry s = geometry_of(qkv, n_q_heads, n_kv_heads);
  if (!eligible(segment_ids, qkv, {&dqkv, &dout, &out, &lse}, s.D) || dqkv.dtype != DType::bf16 ||
      dout.dtype != DType::bf16 || out.dtype != DType::bf16)
    return false;
  CudaState& state = state_of(ctx, op);
  const Variant variant = requested_variant();
  // The fast variant keeps no T x T matrix: one call. The deterministic one in slices whose
  // workspace is within the limit.
  const CudnnBackwardSplit split = variant == Variant::fast
                                       ? CudnnBackwardSplit{s.B, s.Hkv}
                                       : cudnn_backward_split(s.B, s.T, s.Hq, s.Hkv, cudnn_backward_workspace_limit());
  if (!split.fits()) return false;
  const int64_t group = s.Hq / s.Hkv;
  // A slice's lse starts (b * Hq + q_head) * T floats in, and cuDNN wants 16-byte alignment.
  // cudnn_backward_split gives only aligned slices, so the memory plan's note names what runs.
  INGOT_CHECK((split.rows == s.B || (split.rows * s.Hq * s.T) % 4 == 0) &&
                  (split.kv_heads == s.Hkv || (split.kv_heads * group * s.T) % 4 == 0),
              op, ": slices of ", split.rows, " row(s) x ", split.kv_heads, " kv head(s) at T = ", s.T,
              " would start lse unaligned");
  Geometry slice = s;
  slice.B = split.rows;
  slice.Hkv = split.kv_heads;
  slice.Hq = split.kv_heads * group;
  cudnnHandle_t handle = nullptr;
  const Plan& plan = plan_for(state, true, slice, variant, &handle);
  if (!plan.plan) return false;
  float scale_f = float(scale), lowest = std::numeric_limits<float>::lowest(), one = 1.f;
  const int64_t D = s.D, T = s.T, Htot = s.stored_Htot();
  for (int64_t b = 0; b < s.B; b += split.rows)
    for (int64_t kv = 0; kv < s.Hkv; kv += split.kv_heads) {
      const int64_t q_head = kv * group;
      // Element offsets of this slice's first row and heads in qkv/dqkv, out/dout and lse.
      const int64_t packed = b * T * Htot * D, q_off = packed + q_head * D, k_off = packed + (s.Hq + kv) * D,
                    v_off = packed + (s.Hq + s.Hkv + kv) * D;
      const int64_t out_off = (b * T * s.Hq + q_head) * D, lse_off = (b * s.Hq + q_head) * T;
      bf16 *base = qkv.ptr<bf16>(), *dbase = dqkv.ptr<bf16>();
      execute(state, handle, plan, {kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kScale, kLowest, kOne},
              {base + q_off, base + k_off, base + v_off, out.ptr<bf16>() + out_off, dout.ptr<bf16>() + out_off,
               lse.ptr<float>() + lse_off, dbase + q_off, dbase + k_off, dbase + v_off, &scale_f, &lowest, &one},
              op);
    }
  attention_set_last_path(variant == Variant::fast ? "cudnn-fast"
                          : split.calls(s.B, s.Hkv) == 1 ? "cudnn"
                                                          : "cudnn-split");
  return true;
}

// ---- packed rows, forward: long documents on cuDNN, short ones on the tensor cores --------------
// (The backward stays on the tensor-core kernels: cuDNN 9.14's deterministic backward takes a
// workspace of documents x Hq x T x T bf16 for variable-length sequences, 66 GiB for Llama-3.2-1B's
// heads at 4 x 4096; docs/cuda.md.)

namespace {

// Scratch of the documents forward: the table | cuDNN's dense stats (slots, Hq, T) f32 | then
// either the tensor-core kernels' tile ranges or the plan's workspace (they run one after the
// other on one stream).
struct DocumentScratch {
  DocumentTable table;
  float* stats = nullptr;
  int64_t offset = 0;  // where the callees' scratch starts
};

// Whether the documents path can take this call: segment ids, cuDNN not declined, shapes both
// cuDNN and the tensor-core forward take, T within the table builder's reach, and element
// offsets into qkv and cuDNN's dense stats (slots, Hq, T) that fit int32.
bool documents_eligible(Context& ctx, const Tensor& segment_ids, const Tensor& qkv, int n_q_heads,
                        std::initializer_list<const Tensor*> others) {
  if (!segment_ids.present()) return false;
  if (!eligible(Tensor{}, qkv, others, qkv.dim(3)) || !attention_mma_supports(ctx, qkv, n_q_heads, false))
    return false;
  const int64_t Htot = qkv.dim(2);
  return documents_take_shapes(qkv.dim(0), qkv.dim(1), n_q_heads, (Htot - n_q_heads) / 2, qkv.dim(3));
}

Geometry document_geometry(const Geometry& rows) {
  Geometry docs = rows;
  docs.B = document_slots(int(rows.B), int(rows.T));
  docs.documents = true;
  return docs;
}

// Reserves scratch for the table, the stats and the larger of the callees' needs (reserved up
// front: a callee growing the buffer would move the table), then builds the table.
DocumentScratch document_scratch(CudaState& state, const Geometry& rows, const Plan& plan,
                                 const int32_t* segment_ids, const char* op) {
  const int64_t table_bytes = document_table_bytes(int(rows.B), int(rows.T));
  const int64_t stats_bytes = document_stats_bytes(int(rows.B), int(rows.T), rows.Hq);
  const int64_t mma_bytes = attention_mma_forward_scratch_bytes(rows.B, rows.T);
  DocumentScratch d;
  d.offset = table_bytes + stats_bytes;
  char* base = static_cast<char*>(
      scratch_buffer(state, d.offset + std::max(mma_bytes, plan_scratch_bytes(plan)), op));
  d.table = document_table_at(base, int(rows.B), int(rows.T));
  d.stats = reinterpret_cast<float*>(base + table_bytes);
  build_document_table(state, d.table, segment_ids, rows.stored_Htot() * rows.D, rows.Hq * rows.D);
  return d;
}

}  // namespace

bool attention_cudnn_documents_forward(Context& ctx, Tensor out, Tensor lse, Tensor qkv, Tensor segment_ids,
                                       int n_q_heads, int n_kv_heads, double scale) {
  constexpr const char* op = "attention_forward (cuDNN documents)";
  if (cudnn_declined_by_env() || out.dtype != DType::bf16) return false;
  if (!(scale > 0)) return false;  // the short documents' tensor-core forward needs it (attention_mma_forward)
  if (!documents_eligible(ctx, segment_ids, qkv, n_q_heads, {&out, &lse})) return false;
  const Geometry rows = geometry_of(qkv, n_q_heads, n_kv_heads);
  CudaState& state = state_of(ctx, op);
  cudnnHandle_t handle = nullptr;
  const Plan& plan = plan_for(state, false, document_geometry(rows), Variant::fast, &handle);
  if (!plan.plan) return false;
  const DocumentScratch d = document_scratch(state, rows, plan, segment_ids.ptr<int32_t>(), op);
  // Every row first on the tensor cores (right for the short documents), then cuDNN overwrites
  // the long documents' rows.
  INGOT_CHECK(attention_mma_forward(ctx, out, lse, qkv, segment_ids, n_q_heads, n_kv_heads, scale,
                                    {d.table.short_token, d.offset}),
              op, ": the tensor-core kernels declined a call they support");
  bf16* base = qkv.ptr<bf16>();
  float scale_f = float(scale), lowest = std::numeric_limits<float>::lowest();
  execute(state, handle, plan,
          {kQ, kK, kV, kO, kStats, kScale, kLowest, kQkvOffset, kOutOffset, kSeqLen},
          {base, base + rows.Hq * rows.D, base + (rows.Hq + rows.Hkv) * rows.D, out.data, d.stats,
           &scale_f, &lowest, d.table.qkv_offset, d.table.out_offset, d.table.seq_len},
          op, d.offset);
  document_stats_to_lse(state, d.table, lse.ptr<float>(), d.stats, n_q_heads);
  attention_set_last_path("cudnn+mma");
  return true;
}

#endif  // INGOT_CUDA_USE_CUDNN

}  // namespace ingot::cuda
