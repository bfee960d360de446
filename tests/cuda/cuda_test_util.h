// Host <-> device transfers for the CUDA tests: float vectors in and out of bf16 or f32 device
// tensors (bf16 rounded to nearest even on the way in), and raw bytes for bitwise comparisons.
#pragma once
#include <cstdint>
#include <vector>

#include "ingot/core/dtype.h"
#include "ingot/core/tensor.h"
#include "ingot/ops/cuda/device.h"

namespace ingot::test {

inline void write_floats(Tensor t, const std::vector<float>& values, CudaState* state) {
  if (t.dtype == DType::f32) {
    cuda::copy_to_device(t.data, values.data(), t.bytes(), state);
    return;
  }
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
  cuda::copy_to_device(t.data, bits.data(), t.bytes(), state);
}

inline std::vector<float> read_floats(const Tensor& t, CudaState* state) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::f32) {
    cuda::copy_to_host(out.data(), t.data, t.bytes(), state);
    return out;
  }
  std::vector<uint16_t> bits(out.size());
  cuda::copy_to_host(bits.data(), t.data, t.bytes(), state);
  for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  return out;
}

inline std::vector<uint8_t> read_bytes(const Tensor& t, CudaState* state) {
  std::vector<uint8_t> out(static_cast<size_t>(t.bytes()));
  cuda::copy_to_host(out.data(), t.data, t.bytes(), state);
  return out;
}

}  // namespace ingot::test
