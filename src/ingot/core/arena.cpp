#include "ingot/core/arena.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef INGOT_HAVE_CUDA
#include "ingot/ops/cuda/device.h"
#endif

namespace ingot {

Arena::~Arena() {
  if (!base_) return;
#ifdef INGOT_HAVE_CUDA
  if (device_ == Device::cuda) {
    cuda::device_free(base_);
    return;
  }
#endif
  std::free(base_);
}

void Arena::reserve(int64_t bytes) {
  INGOT_CHECK(base_ == nullptr, "arena ", category_, " reserved twice");
  capacity_ = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  used_ = 0;
  if (capacity_ == 0) return;
  if (device_ == Device::cuda) {
#ifdef INGOT_HAVE_CUDA
    base_ = static_cast<char*>(cuda::device_alloc(capacity_));
#else
    fail("arena ", category_, ": this build has no CUDA backend");
#endif
  } else {
    base_ = static_cast<char*>(std::aligned_alloc(kAlignment, static_cast<size_t>(capacity_)));
    INGOT_CHECK(base_ != nullptr, "out of host memory allocating ", format_bytes(capacity_), " for ", category_);
  }
}

Tensor Arena::allocate(DType dtype, std::initializer_list<int64_t> shape) {
  // Checked products: a plan for absurd sizes (every config.json limit at once, a huge batch) wrapped
  // around to a negative total, and the memory check then passed it.
  int64_t elements = 1, bytes = 0, used_after = 0;
  bool overflow = false;
  for (const int64_t d : shape) overflow = overflow || __builtin_mul_overflow(elements, d, &elements);
  overflow = overflow || __builtin_mul_overflow(elements, int64_t(dtype_size(dtype)), &bytes) ||
             __builtin_add_overflow(bytes, kAlignment - 1, &bytes) || __builtin_add_overflow(used_, bytes, &used_after);
  if (overflow) {
    std::string dims;
    for (const int64_t d : shape) {
      if (!dims.empty()) dims += ',';
      dims += std::to_string(d);
    }
    fail("arena ", category_, ": the plan needs more than 2^63 bytes (at a ", dtype_name(dtype), " tensor of shape (", dims,
         ")), far beyond any device: check the model's sizes, micro_batch_size and sequence_len");
  }
  Tensor t(nullptr, dtype, device_, shape);
  bytes = bytes / kAlignment * kAlignment;
  if (base_) {
    INGOT_CHECK(used_ + bytes <= capacity_, "arena ", category_, " overflow: plan changed between passes");
    t.data = base_ + used_;
  }  // measuring: the view stays null, so any use before reserve() fails loudly
  used_ += bytes;
  return t;
}

void copy_from_host(Context& ctx, Tensor dst, const void* src) {
  if (dst.device == Device::cpu) {
    std::memcpy(dst.data, src, static_cast<size_t>(dst.bytes()));
    return;
  }
#ifdef INGOT_HAVE_CUDA
  cuda::copy_to_device(dst.data, src, dst.bytes(), ctx.cuda);
#else
  fail("copy_from_host: no CUDA backend in this build");
#endif
}

void copy_to_host(Context& ctx, void* dst, Tensor src) {
  if (src.device == Device::cpu) {
    std::memcpy(dst, src.data, static_cast<size_t>(src.bytes()));
    return;
  }
#ifdef INGOT_HAVE_CUDA
  cuda::copy_to_host(dst, src.data, src.bytes(), ctx.cuda);
#else
  fail("copy_to_host: no CUDA backend in this build");
#endif
}

std::vector<double> to_host_doubles(Context& ctx, Tensor src) {
  std::vector<char> raw(static_cast<size_t>(src.bytes()));
  copy_to_host(ctx, raw.data(), src);
  const int64_t n = src.numel();
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const char* p = raw.data() + i * dtype_size(src.dtype);
    switch (src.dtype) {
      case DType::f32: { float v; std::memcpy(&v, p, 4); out[i] = v; break; }
      case DType::f64: { double v; std::memcpy(&v, p, 8); out[i] = v; break; }
      case DType::bf16: { uint16_t v; std::memcpy(&v, p, 2); out[i] = bf16_to_f32(v); break; }
      case DType::f16: { uint16_t v; std::memcpy(&v, p, 2); out[i] = f16_to_f32(v); break; }
      case DType::i32: { int32_t v; std::memcpy(&v, p, 4); out[i] = v; break; }
      case DType::i64: { int64_t v; std::memcpy(&v, p, 8); out[i] = static_cast<double>(v); break; }
      case DType::u8: out[i] = static_cast<uint8_t>(*p); break;
      case DType::u16: { uint16_t v; std::memcpy(&v, p, 2); out[i] = v; break; }
    }
  }
  return out;
}

std::string format_bytes(int64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  return buf;
}

}  // namespace ingot
