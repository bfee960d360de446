// The model's parameters as one flat buffer per role (weights, gradients, master, m, v), each
// parameter at the same element offset in every buffer. Flat storage makes "zero all grads", the
// global grad norm, checkpointing and (later) NCCL bucketing single passes over one range.
//
// Ingot fuses q/k/v into one qkv weight and gate/up into one gate_up weight (one GEMM each); the
// Hugging Face tensors map onto row ranges of those (HfPiece), so import/export stays by HF names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ingot/core/tensor.h"
#include "ingot/model/config.h"

namespace ingot {

enum class ParamInit { normal, ones, zeros };
enum class ParamKind { matrix, embedding, norm, bias };

struct HfPiece {
  std::string hf_name;
  int64_t row_begin, row_end;   // rows of the Ingot parameter this HF tensor fills
};

struct ParamEntry {
  std::string name;              // Ingot name, e.g. "layers.3.qkv"
  std::vector<int64_t> shape;    // (rows, cols) or (n)
  int64_t offset = 0;            // element offset in the flat buffers
  int64_t numel = 0;
  ParamKind kind = ParamKind::matrix;
  ParamInit init = ParamInit::normal;
  std::vector<HfPiece> pieces;
  // End of the entry's slot in the flat buffers: every parameter starts 64-element aligned, so
  // vector loads of any dtype stay aligned; [offset + numel, slot_end) is padding.
  int64_t slot_end() const { return offset + (numel + 63) / 64 * 64; }
};

// Builds the parameter list (names, shapes, offsets, HF mapping) for a config.
std::vector<ParamEntry> plan_parameters(const ModelConfig& config);
int64_t total_numel(const std::vector<ParamEntry>& entries);

// A view of parameter `entry` inside a flat buffer `flat` (shape from the entry).
Tensor param_view(const Tensor& flat, const ParamEntry& entry);

// Named views into one flat buffer, in the model's own structure.
struct LayerParams {
  Tensor input_norm;      // (C)
  Tensor qkv;             // (Htot*D, C)
  Tensor qkv_bias;        // (Htot*D) or absent
  Tensor q_norm, k_norm;  // (D) or absent (qwen3 only)
  Tensor o;               // (C, Hq*D)
  Tensor post_norm;       // (C)
  Tensor gate_up;         // (2F, C)
  Tensor down;            // (C, F)
};
struct ModelParams {
  Tensor embed;           // (V, C)
  std::vector<LayerParams> layers;
  Tensor final_norm;      // (C)
  Tensor lm_head;         // (V, C); the same storage as embed when tied
};
ModelParams bind_params(const ModelConfig& config, const std::vector<ParamEntry>& entries,
                        const Tensor& flat);

}  // namespace ingot
