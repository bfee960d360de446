// Precision recipe: which dtype each class of tensor uses. Model code asks the recipe and never
// hard-codes a dtype, so FP8/NF4 recipes can later swap GEMM inputs without touching the model.
#pragma once
#include <string>

#include "ingot/core/tensor.h"

namespace ingot {

struct Recipe {
  std::string name;
  DType param = DType::f32;        // weights used in compute
  DType grad = DType::f32;         // parameter gradients (accumulated over micro-batches)
  DType activation = DType::f32;   // saved activations and their gradients
  DType optimizer_state = DType::f32;
  bool master_weights = false;     // f32 master copy updated by the optimizer, param = rounded copy
};

// "fp32" / "fp64" (CPU reference; fp64 is for tests) and "bf16" (CUDA: bf16 weights and
// activations, f32 gradients, f32 master weights and AdamW state). master_weights=false turns the
// f32 master copy off (weights then updated in bf16 directly).
Recipe make_recipe(const std::string& precision, Device device, bool master_weights = true);

}  // namespace ingot
