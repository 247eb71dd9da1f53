// The wire codecs' loops (kernels/codec.h), compiled once per instruction set beside the
// reduction loops. Written so that the compiler vectorizes them: no branch in the loop body.
#include <bit>
#include <cstddef>
#include <cstdint>

namespace gradsync::kernels::GRADSYNC_KERNEL_NAMESPACE {

// One value rounded to bf16, to nearest even.
inline uint16_t to_bf16(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  // Adding 0x7fff plus the lowest kept bit rounds half to even; a carry into the exponent is
  // the right result (up to infinity for the largest values).
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // A NaN whose payload sits in the dropped bits would round to infinity: keep it quiet NaN.
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

void encode_bf16(uint16_t* __restrict dst, const float* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = to_bf16(src[i]);
}

void decode_bf16(float* __restrict dst, const uint16_t* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    dst[i] = std::bit_cast<float>(static_cast<uint32_t>(src[i]) << 16);
  }
}

void round_bf16(uint16_t* __restrict wire, float* __restrict data, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const uint16_t encoded = to_bf16(data[i]);
    wire[i] = encoded;
    data[i] = std::bit_cast<float>(static_cast<uint32_t>(encoded) << 16);
  }
}

}  // namespace gradsync::kernels::GRADSYNC_KERNEL_NAMESPACE
