// How PyTorch's element types and reduction ops map onto gradsync's, with the errors a caller
// sees for those gradsync does not carry.
#pragma once

#include <gradsync/gradsync.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>

namespace gradsync::torch_backend {

// What a reduced tensor's elements travel and are reduced as: its own type where gradsync has
// it; int32 for the narrower integers and bool, whose sums and products (taken modulo their
// width, as Gloo's wrap), minima, maxima and bitwise reductions come out the same.
struct ReducedType {
  at::ScalarType scalar;
  gradsync_dtype dtype;
  size_t bytes() const { return c10::elementSize(scalar); }
};

// A PyTorch reduction as gradsync runs it: the op, and for PREMUL_SUM the factor every rank's
// input is multiplied by as it is staged (the sum then runs as SUM, and the input stays as it
// was, as NCCL leaves it).
struct Reduction {
  gradsync_op op = GRADSYNC_SUM;
  at::Tensor premultiplier;  // a scalar; undefined but for PREMUL_SUM
  bool premultiplied() const { return premultiplier.defined(); }
};

// Throws (a RuntimeError in Python) naming the call and the op for ops gradsync has none of.
Reduction reduction_of(const c10d::ReduceOp& op, const char* call);

// Throws (a RuntimeError in Python) naming the call and the dtype where there is none, or
// where the reduction does not take it (the bitwise ops reduce integer and bool tensors only,
// PREMUL_SUM floating-point ones).
ReducedType reduced_type(const at::Tensor& tensor, const Reduction& reduction, const char* call);

// Collectives that only move bytes (broadcast, allgather) carry any element type: its bytes
// travel as 4-byte words, the last one padded.
inline constexpr gradsync_dtype kWordDtype = GRADSYNC_INT32;
inline constexpr size_t kWordBytes = 4;
inline size_t padded_to_words(size_t bytes) {
  return (bytes + kWordBytes - 1) / kWordBytes * kWordBytes;
}

}  // namespace gradsync::torch_backend
