#include "ingot/recipe/recipe.h"

#include "ingot/core/error.h"

namespace ingot {

Recipe make_recipe(const std::string& precision, Device device, bool master_weights) {
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
    r.grad = DType::f32;
    r.optimizer_state = DType::f32;
    r.master_weights = master_weights;
    return r;
  }
  fail("unknown precision \"", precision, "\"; supported: fp32, bf16 (fp64 for tests)");
}

}  // namespace ingot
