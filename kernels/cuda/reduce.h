// Device reduction kernels: the GPU twin of kernels/reduce.h, with the same semantics, so
// that a device result equals the host one bit for bit (f16/bf16 accumulate in f32, i32 in
// i64; integer sums and products wrap; avg multiplies floats by 1/K and truncates integers).
//
// Inputs and outputs are device pointers any GPU the launching device can reach (its own
// memory, or a peer's through a CUDA IPC mapping with peer access). Where every pointer is
// 16-byte aligned the kernel moves 16 bytes per load and store; otherwise it falls back to one
// element at a time.
#pragma once

#include <gradsync/gradsync.h>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace gradsync::kernels::cuda {

// Arrays of pointers travel as kernel parameters: at most this many inputs, and outputs.
inline constexpr size_t kMaxOperands = 16;

// Enqueues the reduction of `num_inputs` arrays of `count` elements into each of
// `num_outputs` arrays on `stream` (of the current device). Outputs may alias inputs: each
// element's inputs are read before any of its outputs is written. Returns the launch's
// status (cudaErrorInvalidValue for more than kMaxOperands operands or an unknown dtype/op).
cudaError_t reduce_to_all(gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
                          size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count,
                          cudaStream_t stream);

}  // namespace gradsync::kernels::cuda
