// Stochastic rounding from f32 to bf16, for the optimizer's bf16 stores (ops.h, adamw_step with
// AdamWConstants::stochastic_rounding). A value rounds up to the next bf16 with probability equal
// to its distance from the bf16 below, over the gap between the two: the rounding is unbiased, so
// an update smaller than half a bf16 step still moves the stored value in expectation, where
// rounding to nearest drops it every time. The random bits are a pure function of (seed, update,
// element), built on rng.h's splitmix64, so an update rounds the same way on the CPU and on CUDA,
// for any thread count, and in a replayed CUDA graph.
#pragma once
#include <cstdint>

#include "ingot/core/rng.h"

namespace ingot {

// The stream of update `update` (1-based). The tag ("rounding" in ASCII) keeps these streams apart
// from rng.h's initialisation streams of the same seed.
constexpr uint64_t kRoundingStreamTag = 0x726f756e64696e67ull;
INGOT_HOST_DEVICE inline uint64_t rounding_stream(uint64_t seed, uint64_t update) {
  return splitmix64(seed ^ kRoundingStreamTag ^ splitmix64(update));
}

// 64 random bits for element `index` of a stream; one such draw gives the 16 bits each of an
// element's three stores (params, m, v) need. Elements come in groups of 8 (index >> 3): a group
// takes one splitmix64, and each element spreads it with its lane (index & 7): an xor with the
// lane's own constant (splitmix64 of the lane), one 64-bit multiply and an xorshift. One
// splitmix64 an element made the CUDA update compute-bound (docs/perf.md); the CUDA kernel's
// 8-element chunks are these groups, so the lanes' constants fold at compile time. (An additive
// lane offset instead of the xor left neighbouring elements' draws correlated at about 0.5:
// StochasticRounding.DrawsLookUniformAndUncorrelated.)
INGOT_HOST_DEVICE inline uint64_t rounding_group_bits(uint64_t stream, uint64_t group) { return splitmix64(stream + group); }
INGOT_HOST_DEVICE inline uint64_t rounding_lane_bits(uint64_t group_bits, uint32_t lane) {
  const uint64_t x = (group_bits ^ splitmix64(lane)) * 0xd6e8feb86659fd93ull;
  return x ^ (x >> 32);
}
INGOT_HOST_DEVICE inline uint64_t rounding_bits(uint64_t stream, uint64_t index) {
  return rounding_lane_bits(rounding_group_bits(stream, index >> 3), static_cast<uint32_t>(index & 7));
}

// f32 bits -> bf16 bits. Adding 16 random bits below bf16's last place carries into it with
// probability (the 16 dropped bits) / 2^16; in the sign-magnitude layout that rounds away from
// zero with that probability for negative values too. Inf stays inf, NaN stays a quiet NaN.
INGOT_HOST_DEVICE inline uint16_t bf16_bits_stochastic(uint32_t f32_bits, uint32_t random16) {
  if ((f32_bits & 0x7f800000u) == 0x7f800000u)
    return static_cast<uint16_t>((f32_bits >> 16) | ((f32_bits & 0x007fffffu) ? 0x40u : 0u));
  return static_cast<uint16_t>((f32_bits + (random16 & 0xffffu)) >> 16);
}

// Whether an AdamW update draws at all: stochastic rounding asked for, and some store that carries
// the update is bf16 (the moments, or the params without a master copy, which otherwise receive
// master's copy rounded to nearest). The one rule for the recipe, the CPU op and the CUDA op.
inline bool adamw_draws(bool stochastic_rounding, bool moments_bf16, bool params_bf16, bool has_master) {
  return stochastic_rounding && (moments_bf16 || (params_bf16 && !has_master));
}

// Which 16 bits of an element's draw each store takes.
enum class RoundingDraw : int { params = 0, m = 16, v = 32 };
INGOT_HOST_DEVICE inline uint32_t rounding_draw(uint64_t bits, RoundingDraw which) {
  return static_cast<uint32_t>(bits >> static_cast<int>(which)) & 0xffffu;
}

}  // namespace ingot
