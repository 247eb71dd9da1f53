// Wire codecs: what an inter-node stage sends in place of the data, and back. Pure functions
// over pointers, one build per instruction set like the reduction loops.
//
// bf16 keeps f32's exponent and the top 7 bits of its mantissa: half the bytes on the wire, a
// relative error of at most 2^-9 per rounding, and the same range (no overflow, unlike f16).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradsync::kernels {

// dst[i] = src[i] rounded to bf16, to nearest even (NaN stays NaN, infinities stay).
void encode_bf16(uint16_t* dst, const float* src, size_t count);
// dst[i] = src[i] widened to f32 (exact).
void decode_bf16(float* dst, const uint16_t* src, size_t count);
// wire[i] = data[i] encoded as by encode_bf16, and data[i] = wire[i] decoded: a value rounded
// in place beside its wire image, in one pass where an encode and a decode take two.
void round_bf16(uint16_t* wire, float* data, size_t count);

}  // namespace gradsync::kernels
