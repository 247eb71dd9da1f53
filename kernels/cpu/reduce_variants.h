// The per-instruction-set builds of the reduction loops, for the dispatcher and for tests that
// check every build (not only the one this CPU would pick).
#pragma once

#include <gradsync/gradsync.h>

#include <cstddef>
#include <cstdint>

namespace gradsync::kernels {

using ReduceFn = void (*)(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*,
                          size_t, size_t, bool);
using CopyFn = void (*)(void*, const void*, size_t, bool);
using EncodeBf16Fn = void (*)(uint16_t*, const float*, size_t);
using DecodeBf16Fn = void (*)(float*, const uint16_t*, size_t);
using RoundBf16Fn = void (*)(uint16_t*, float*, size_t);

namespace generic {
void reduce_to_all(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*, size_t,
                   size_t, bool);
void copy(void*, const void*, size_t, bool);
void encode_bf16(uint16_t*, const float*, size_t);
void decode_bf16(float*, const uint16_t*, size_t);
void round_bf16(uint16_t*, float*, size_t);
}  // namespace generic
namespace avx2 {
void reduce_to_all(gradsync_dtype, gradsync_op, const void* const*, size_t, void* const*, size_t,
                   size_t, bool);
void copy(void*, const void*, size_t, bool);
void encode_bf16(uint16_t*, const float*, size_t);
void decode_bf16(float*, const uint16_t*, size_t);
void round_bf16(uint16_t*, float*, size_t);
}  // namespace avx2

bool cpu_has_avx2();

}  // namespace gradsync::kernels
