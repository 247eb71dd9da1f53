// What client and daemon agree on: protocol version, limits, and the checks both sides use.
#pragma once

#include "kernels/dtype.h"

#include <gradsync/gradsync.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradsync::ipc {

// Bumped on any incompatible change to protocol.capnp or the segment layout.
inline constexpr uint32_t kProtocolVersion = 1;

// Upper bound on one framed control message; larger frames are a protocol error.
inline constexpr uint32_t kMaxFrameBytes = 64 * 1024;
// Upper bound on file descriptors attached to one frame: a registration of VMM device memory
// sends one per physical segment (PyTorch's expandable segments are 20 MiB each).
inline constexpr int kMaxFdsPerFrame = 64;
// Capnp traversal limit for untrusted input (words).
inline constexpr uint64_t kTraversalLimitWords = kMaxFrameBytes / 8;

inline constexpr size_t kMaxJobNameBytes = 63;
// Ranks of one job on one node.
inline constexpr int32_t kMaxLocalRanks = 256;
// Tensor names longer than this (bytes, without the terminating NUL) are rejected.
inline constexpr size_t kMaxTensorNameBytes = 159;
// The client names each unnamed collective this, then its sequence number ("~17"): such a name
// is used once, so the daemons never cache its negotiation.
inline constexpr char kUnnamedPrefix = '~';
inline constexpr size_t kMaxErrorMessageBytes = 223;

enum class Collective : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,
  kBarrier = 3,
  kReduceScatter = 4,
  kAllToAll = 5,
};
inline constexpr Collective kLastCollective = Collective::kAllToAll;

const char* collective_name(Collective c);
// A comma-separated list of addresses (GRADSYNC_NODES, GRADSYNC_AGGREGATORS), the spaces
// around each and empty entries left out.
std::vector<std::string> split_addresses(std::string_view list);
// Whether it reduces (takes an op).
constexpr bool reduces(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduceScatter;
}
// Whether its send range holds a block for each rank (of `count` elements), and its receive
// range a block from each.
constexpr bool sends_a_block_per_rank(Collective c) {
  return c == Collective::kReduceScatter || c == Collective::kAllToAll;
}
constexpr bool receives_a_block_per_rank(Collective c) {
  return c == Collective::kAllgather || c == Collective::kAllToAll;
}
const char* dtype_name(gradsync_dtype d);
const char* op_name(gradsync_op op);

// The checks below are inline: client and engine run them for every submission.
constexpr std::optional<Collective> parse_collective(uint32_t raw) {
  if (raw > static_cast<uint32_t>(kLastCollective)) return std::nullopt;
  return static_cast<Collective>(raw);
}

constexpr std::optional<gradsync_dtype> parse_dtype(uint32_t raw) {
  if (raw > GRADSYNC_INT64) return std::nullopt;
  return static_cast<gradsync_dtype>(raw);
}

constexpr std::optional<gradsync_op> parse_op(uint32_t raw) {
  if (raw > GRADSYNC_BXOR) return std::nullopt;
  return static_cast<gradsync_op>(raw);
}

constexpr bool is_bitwise(gradsync_op op) {
  return op == GRADSYNC_BAND || op == GRADSYNC_BOR || op == GRADSYNC_BXOR;
}
constexpr bool is_integer(gradsync_dtype d) {
  return d == GRADSYNC_INT32 || d == GRADSYNC_INT64;
}
// Whether `op` reduces `d`: the bitwise ops have no meaning on floating-point bits.
constexpr bool op_reduces(gradsync_op op, gradsync_dtype d) {
  return !is_bitwise(op) || is_integer(d);
}

// Size of one element; 0 for an invalid dtype.
using kernels::dtype_bytes;

// count * element size, or nullopt when it overflows.
constexpr std::optional<uint64_t> checked_bytes(uint64_t count, gradsync_dtype d) {
  uint64_t bytes = 0;
  const size_t element = dtype_bytes(d);
  if (element == 0 || __builtin_mul_overflow(count, element, &bytes)) return std::nullopt;
  return bytes;
}

// The bytes of a collective's send and receive ranges for `count` elements among `ranks`
// ranks (a block per rank where the collective has one: sends_a_block_per_rank and
// receives_a_block_per_rank), or nullopt when either overflows.
struct RangeBytes {
  uint64_t send = 0;
  uint64_t recv = 0;
};
constexpr std::optional<RangeBytes> checked_range_bytes(Collective c, uint64_t count,
                                                        gradsync_dtype d, uint64_t ranks) {
  const std::optional<uint64_t> block = checked_bytes(count, d);
  RangeBytes range;
  if (!block ||
      __builtin_mul_overflow(*block, sends_a_block_per_rank(c) ? ranks : 1, &range.send) ||
      __builtin_mul_overflow(*block, receives_a_block_per_rank(c) ? ranks : 1, &range.recv)) {
    return std::nullopt;
  }
  return range;
}

}  // namespace gradsync::ipc
