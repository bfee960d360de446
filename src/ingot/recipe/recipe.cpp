#include "ingot/recipe/recipe.h"

#include "ingot/core/error.h"
#include "ingot/core/stochastic_rounding.h"

namespace ingot {

RecipeOptionProblem find_recipe_option_problem(const RecipeOptions& options, const std::string& precision) {
  const bool full_precision = precision == "fp32" || precision == "fp64";
  for (const auto& [key, value] : {std::pair{"grad_dtype", &options.grad_dtype},
                                   std::pair{"optimizer_state_dtype", &options.optimizer_state_dtype}}) {
    if (*value != "f32" && *value != "bf16") return {key, std::string(key) + " must be f32 or bf16, got \"" + *value + "\""};
    if (*value == "bf16" && full_precision)
      return {key, std::string(key) + " \"bf16\" needs precision bf16 (the CUDA recipe); precision " + precision +
                       " keeps every tensor in " + precision};
  }
  if (options.stochastic_rounding && full_precision)
    return {"stochastic_rounding", "stochastic_rounding: true needs precision bf16 (the CUDA recipe); precision " +
                                       precision + " stores nothing in bf16"};
  if (!options.master_weights && full_precision)
    return {"master_weights", "master_weights: false needs precision bf16 (the CUDA recipe); precision " + precision +
                                  " trains its " + precision + " weights themselves, with no separate master copy"};
  return {};
}

void check_recipe_options(const RecipeOptions& options, const std::string& precision) {
  if (const RecipeOptionProblem problem = find_recipe_option_problem(options, precision); problem.key)
    fail(problem.message);
}

Recipe make_recipe(const std::string& precision, Device device, const RecipeOptions& options) {
  check_recipe_options(options, precision);
  Recipe r;
  r.name = precision;
  if (precision == "fp32" || precision == "fp64") {
    const DType t = precision == "fp32" ? DType::f32 : DType::f64;
    r.param = r.grad = r.activation = r.optimizer_state = t;
    r.master_weights = false;
    return r;
  }
  if (precision == "bf16") {
    INGOT_CHECK(device == Device::cuda, "precision \"bf16\" needs the CUDA backend; the CPU runs \"fp32\"");
    r.param = DType::bf16;
    r.activation = DType::bf16;
    r.grad = options.grad_dtype == "bf16" ? DType::bf16 : DType::f32;
    r.optimizer_state = options.optimizer_state_dtype == "bf16" ? DType::bf16 : DType::f32;
    r.master_weights = options.master_weights;
    r.stochastic_rounding = options.stochastic_rounding;
    return r;
  }
  fail("unknown precision \"", precision, "\"; supported: fp32, bf16 (fp64 for tests)");
}

bool rounds_stochastically(const Recipe& r) {
  return adamw_draws(r.stochastic_rounding, r.optimizer_state == DType::bf16, r.param == DType::bf16, r.master_weights);
}

std::string describe(const Recipe& r) {
  if (r.name != "bf16") return r.name;  // fp32 / fp64: every tensor in that dtype
  return r.name + " (grads " + std::string(dtype_name(r.grad)) + ", optimizer state " +
         std::string(dtype_name(r.optimizer_state)) + (r.master_weights ? ", master weights f32" : ", no master weights") +
         (rounds_stochastically(r) ? ", stochastic rounding)" : ")");
}

}  // namespace ingot
