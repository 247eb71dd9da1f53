// Host reduction kernels: pure functions over pointers.
#pragma once

#include <gradsync/gradsync.h>

#include <cstddef>

namespace gradsync::kernels {

// Reduces `num_inputs` arrays of `count` elements element-wise with `op` and writes the result
// into each of the `num_outputs` arrays. Outputs may alias inputs (in-place collectives): the
// work is cache-blocked, every input block is read into an accumulator before any output block
// is written, so memory traffic is num_inputs reads + num_outputs writes. f16/bf16 accumulate in
// f32, i32 in i64; integer sums and products wrap; avg divides by num_inputs (integers truncate).
// Pointers must be aligned to the element size.
//
// `streaming` writes the outputs with non-temporal stores: right for results larger than the
// cache (no read-for-ownership of the destination, inputs stay cached), wrong for small ones
// the rank is about to read. The caller decides, knowing the whole collective's size.
void reduce_to_all(gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
                   size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count,
                   bool streaming);

// memcpy, or with non-temporal stores when `streaming` (as above).
void copy(void* dst, const void* src, size_t bytes, bool streaming);

// data[i] /= divisor, in place: floats multiply by 1/divisor (16-bit floats through f32),
// integers divide and truncate. Finishes an average whose sum was reduced in pieces.
void divide(gradsync_dtype dtype, void* data, size_t count, uint64_t divisor);

// Results at least this large are written with non-temporal stores.
inline constexpr size_t kStreamingMinBytes = 1 << 20;

// The instruction set the dispatcher chose on this CPU ("avx2" or "generic").
const char* reduce_isa();

}  // namespace gradsync::kernels
