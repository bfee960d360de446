// Tensor: a non-owning view (pointer, shape, dtype, device). Memory is owned by an Arena (or a
// std::vector in tests); views are cheap to copy and always row-major contiguous.
// An "absent" optional tensor has data == nullptr (e.g. a linear layer without bias).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "ingot/core/dtype.h"
#include "ingot/core/error.h"

namespace ingot {

enum class Device : uint8_t { cpu, cuda };

struct Tensor {
  static constexpr int kMaxDims = 5;
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* data_, DType dtype_, Device device_, std::initializer_list<int64_t> dims)
      : data(data_), dtype(dtype_), device(device_) {
    INGOT_CHECK(dims.size() <= kMaxDims, "tensor rank ", dims.size(), " exceeds ", kMaxDims);
    for (int64_t d : dims) shape[ndim++] = d;
  }

  bool present() const { return data != nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t bytes() const { return numel() * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  template <typename T> T* ptr() const { return static_cast<T*>(data); }

  // Same storage, new shape; numel must match.
  Tensor view(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, device, dims);
    INGOT_CHECK(t.numel() == numel(), "view ", t.shape_string(), " does not match ", shape_string());
    return t;
  }
  // Rows [begin, end) along dim 0.
  Tensor slice_rows(int64_t begin, int64_t end) const {
    Tensor t = *this;
    const int64_t row_bytes = (ndim ? bytes() / shape[0] : 0);
    t.data = static_cast<char*>(data) + begin * row_bytes;
    t.shape[0] = end - begin;
    return t;
  }
  std::string shape_string() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) {
      if (i) s += ',';
      s += std::to_string(shape[i]);
    }
    s += ')';
    return s;
  }
};

}  // namespace ingot
