// How PyTorch's element types and reduction ops map onto gradsync's, with the errors a caller
// sees for those gradsync does not carry.
#pragma once

#include <gradsync/gradsync.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>

namespace gradsync::torch_backend {

// The gradsync dtype of a tensor that is reduced; throws (a RuntimeError in Python) naming the
// call and the dtype where gradsync has none.
gradsync_dtype reduced_dtype(const at::Tensor& tensor, const char* call);

// The gradsync op of a PyTorch reduction; throws naming the call and the op for the bitwise
// ops and PREMUL_SUM.
gradsync_op reduction_op(const c10d::ReduceOp& op, const char* call);

// Collectives that only move bytes (broadcast, allgather) carry any element type: its bytes
// travel as 4-byte words, the last one padded.
inline constexpr gradsync_dtype kWordDtype = GRADSYNC_INT32;
inline constexpr size_t kWordBytes = 4;
inline size_t padded_to_words(size_t bytes) {
  return (bytes + kWordBytes - 1) / kWordBytes * kWordBytes;
}

}  // namespace gradsync::torch_backend
