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
  bool stochastic_rounding = false;  // the optimizer's bf16 stores round stochastically (ops.h, adamw_step)
};

// What a bf16 run may change from the defaults (config keys master_weights, grad_dtype and
// optimizer_state_dtype). Turning all three down gives the memory of a model held in bf16 with
// torch.optim.AdamW: bf16 weights, gradients and moments, every update rounded to bf16.
struct RecipeOptions {
  bool master_weights = true;                 // f32 master copy of the weights for the optimizer
  std::string grad_dtype = "f32";             // f32 | bf16: parameter gradients
  std::string optimizer_state_dtype = "f32";  // f32 | bf16: AdamW's m and v (updated in f32, stored rounded)
  // Round the optimizer's bf16 stores (weights without master, bf16 moments) stochastically
  // instead of to nearest, so that updates below half a bf16 step are kept in expectation.
  bool stochastic_rounding = false;
};

// "fp32" / "fp64" (CPU reference; fp64 is for tests) and "bf16" (CUDA: bf16 weights and
// activations; gradients, master weights and AdamW state as the options say). The fp32/fp64
// recipes keep everything in their own dtype and accept only the default options' dtypes.
Recipe make_recipe(const std::string& precision, Device device, const RecipeOptions& options = {});

// What make_recipe checks of the options, callable before the device is known (the config parser):
// each dtype is f32 or bf16, and precision fp32 / fp64 takes only f32, master weights on and no
// stochastic rounding ("auto" checks the values only). Errors name the key and its value.
void check_recipe_options(const RecipeOptions& options, const std::string& precision);

// The same checks, reported instead of thrown: the key of the first option at fault and the
// message, or a null key. The config names where that key's value came from (the file or --set).
struct RecipeOptionProblem {
  const char* key = nullptr;
  std::string message;
};
RecipeOptionProblem find_recipe_option_problem(const RecipeOptions& options, const std::string& precision);

// Whether the optimizer rounds any store stochastically: stochastic_rounding is set and some store
// carries an update in bf16 (weights without master, or bf16 moments). With master weights and
// f32 moments the option changes nothing.
bool rounds_stochastically(const Recipe& recipe);

// "fp32", or for bf16 "bf16 (grads f32, optimizer state f32, master weights f32)" and the like
// (", stochastic rounding" where rounds_stochastically): for logs.
std::string describe(const Recipe& recipe);

}  // namespace ingot
