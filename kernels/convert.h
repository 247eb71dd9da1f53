// Element conversions for the 16-bit float formats, shared by the kernels, codecs and tests.
// Internal linkage on purpose: the kernels are compiled once per instruction set, and the AVX2
// copy of a conversion must never be the one the linker keeps for the baseline build.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace gradsync::kernels {

// IEEE binary16 by exact bit arithmetic, rounding to nearest even. Always compiled (and tested
// against the compiler's conversions) for compilers without _Float16.
static inline float half_to_float_portable(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

static inline uint16_t float_to_half_portable(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf stays inf, NaN stays (quiet) NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  }
  if (magnitude < 0x38800000u) {  // below 2^-14: a half subnormal, in units of 2^-24
    const float units = std::nearbyint(std::bit_cast<float>(magnitude) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  // Normal: rebias the exponent, keep 10 of 23 mantissa bits, round the 13 dropped ones to
  // nearest even. A carry runs into the exponent, up to infinity (0x7c00) for overflow.
  const uint32_t exponent = (magnitude >> 23) - 112;
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  uint32_t half = (exponent << 10) | ((magnitude >> 13) & 0x3ffu);
  const uint32_t dropped = magnitude & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u) != 0)) ++half;
  return static_cast<uint16_t>(sign | std::min<uint32_t>(half, 0x7c00u));
}

// The compiler's _Float16 where it has one (F16C instructions in the AVX2 build).
static inline float half_to_float(uint16_t bits) {
#ifdef __FLT16_MANT_DIG__
  return static_cast<float>(std::bit_cast<_Float16>(bits));
#else
  return half_to_float_portable(bits);
#endif
}

static inline uint16_t float_to_half(float value) {
#ifdef __FLT16_MANT_DIG__
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
#else
  return float_to_half_portable(value);
#endif
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
