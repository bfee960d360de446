#include "ingot/core/dtype.h"

#include <cmath>

namespace ingot {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
  else if (exponent == 31) magnitude = mantissa ? NAN : INFINITY;
  else magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;               // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;              // overflow (>= 65520) -> inf
  if (abs < 0x38800000u) {                                    // subnormal or zero in f16
    const float scaled = std::fabs(f) * 16777216.0f;          // units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);       // round mantissa to 10 bits, RNE
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

}  // namespace ingot
