// Table-driven harness for the CPU op tests (tests/cpu/test_ops_cpu.cpp).
// An OpCase names an op and its shapes and knows how to run it in f32 or f64 on given inputs:
// forward, and backward when output gradients are supplied. From that one function the harness
// derives every check:
//   - backward (float64) against central finite differences of sum(out * random_weights);
//   - float64 forward against a naive reference, when the case has one;
//   - float32 against float64 on the same (float-representable) inputs;
//   - bit-identical results for 1, 2 and 3 threads.
// Errors are norm-wise: ||a - b|| / ||b|| (test_util.h); NaN never passes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ingot/core/context.h"
#include "ingot/core/tensor.h"

namespace ingot::test {

using Values = std::vector<double>;

// A host tensor of dtype f32 or f64 whose contents come from (and go back to) doubles.
// Not copyable or movable: the Tensor view points into the storage.
class Buffer {
 public:
  Buffer(DType dtype, std::initializer_list<int64_t> dims, const Values* init = nullptr)
      : dtype_(dtype) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    void* data = nullptr;
    if (dtype == DType::f32) {
      f32_.assign(static_cast<size_t>(n), 0.0f);
      if (init) for (int64_t i = 0; i < n; ++i) f32_[i] = static_cast<float>((*init)[i]);
      data = f32_.data();
    } else {
      f64_.assign(static_cast<size_t>(n), 0.0);
      if (init) for (int64_t i = 0; i < n; ++i) f64_[i] = (*init)[i];
      data = f64_.data();
    }
    t = Tensor(data, dtype, Device::cpu, dims);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Values values() const {
    return dtype_ == DType::f32 ? Values(f32_.begin(), f32_.end()) : f64_;
  }
  Tensor t;

 private:
  DType dtype_;
  std::vector<float> f32_;
  std::vector<double> f64_;
};

// An i32 host tensor (ids, targets, positions, segment ids).
struct IntBuffer {
  std::vector<int32_t> values;
  Tensor t;
  IntBuffer(std::vector<int32_t> v, std::initializer_list<int64_t> dims) : values(std::move(v)) {
    t = Tensor(values.data(), DType::i32, Device::cpu, dims);
  }
  IntBuffer(const IntBuffer&) = delete;
  IntBuffer& operator=(const IntBuffer&) = delete;
};

struct OpResult {
  std::vector<Values> outputs;  // differentiable outputs first, then statistics (rstd, lse, ...)
  std::vector<Values> grads;    // one per differentiable input, when run with output gradients
};

struct OpCase {
  std::string name;                  // op and shapes; also the gtest parameter name
  std::vector<int64_t> input_sizes;  // differentiable inputs, filled with N(0,1)
  // Forward in `dtype`; with douts (one per differentiable output) also the backward.
  std::function<OpResult(Context&, DType, const std::vector<Values>& inputs,
                         const std::vector<Values>* douts)>
      run;
  // Naive float64 forward (all outputs, statistics included); empty when the case has none.
  std::function<std::vector<Values>(const std::vector<Values>& inputs)> reference;
  int differentiable_outputs = 1;
  double fd_tol = 1e-6;          // analytic vs central differences, float64
  double reference_tol = 1e-12;  // float64 forward vs naive reference
  double f32_tol = 1e-5;         // float32 vs float64, outputs and gradients
  bool finite_differences = true;
  bool uniform_dout = false;     // one scalar output gradient (cross_entropy's dloss_scale)
  int64_t max_fd_coords = 1500;  // finite differences on a random sample of larger inputs
};

}  // namespace ingot::test
