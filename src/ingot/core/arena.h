// Arena: one allocation per memory category, carved into tensors by a bump pointer. Every buffer
// of a run is planned before step 1: plan with a measuring arena (no memory, only sizes), print
// the budget, check it fits, then allocate for real and plan again with identical calls.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ingot/core/context.h"
#include "ingot/core/tensor.h"

namespace ingot {

class Arena {
 public:
  static constexpr int64_t kAlignment = 256;  // bytes; keeps 16-byte vector loads legal on CUDA

  Arena(std::string category, Device device) : category_(std::move(category)), device_(device) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // Measuring mode until reserve(): allocate() hands out null views and only counts bytes.
  void reserve(int64_t bytes);
  void reset() { used_ = 0; }  // hand out the same memory again, from the start
  Tensor allocate(DType dtype, std::initializer_list<int64_t> shape);

  const std::string& category() const { return category_; }
  Device device() const { return device_; }
  int64_t used() const { return used_; }
  int64_t capacity() const { return capacity_; }
  bool measuring() const { return base_ == nullptr; }

 private:
  std::string category_;
  Device device_;
  char* base_ = nullptr;
  int64_t capacity_ = 0, used_ = 0;
};

// Host <-> tensor transfers that work for both devices (CPU: memcpy).
void copy_from_host(Context& ctx, Tensor dst, const void* src);
void copy_to_host(Context& ctx, void* dst, Tensor src);
// Reads any float/int tensor into doubles on the host (converting bf16/f16).
std::vector<double> to_host_doubles(Context& ctx, Tensor src);

std::string format_bytes(int64_t bytes);

}  // namespace ingot
