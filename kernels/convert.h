// Element conversions for the 16-bit float formats, shared by the kernels, codecs and tests.
// Internal linkage on purpose: the kernels are compiled once per instruction set, and the AVX2
// copy of a conversion must never be the one the linker keeps for the baseline build.
#pragma once

#include <bit>
#include <cstdint>

namespace gradsync::kernels {

static inline float half_to_float(uint16_t bits) {
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}
static inline uint16_t float_to_half(float value) {  // round to nearest even
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
}
static inline float bfloat16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
static inline uint16_t float_to_bfloat16(float value) {  // round to nearest even, NaN stays NaN
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace gradsync::kernels
