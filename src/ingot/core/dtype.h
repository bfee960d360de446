// Element types Ingot stores. Invariant: dtype_size() is the storage width in bytes; bf16 and f16
// are stored as raw 16-bit patterns and converted through float on the CPU.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ingot {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8, u16 };

constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: case DType::u16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";   case DType::f64: return "f64";
    case DType::bf16: return "bf16"; case DType::f16: return "f16";
    case DType::i32: return "i32";   case DType::i64: return "i64";
    case DType::u8: return "u8";     case DType::u16: return "u16";
  }
  return "?";
}

// bf16 <-> f32 with round-to-nearest-even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// IEEE half <-> f32, round-to-nearest-even, subnormals handled.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace ingot
