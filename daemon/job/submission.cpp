#include "daemon/job/submission.h"

#include <fmt/format.h>

#include <cstring>

namespace gradsync::daemon {
namespace {

// [offset, offset + bytes) lies inside the buffer and is element-aligned.
bool range_fits(const RegisteredMemory& buffer, uint64_t offset, uint64_t bytes, size_t element) {
  uint64_t end = 0;
  return buffer.error.empty() && buffer.mapping && !__builtin_add_overflow(offset, bytes, &end) &&
         end <= buffer.bytes &&
         (element == 0 || (reinterpret_cast<uintptr_t>(buffer.data) + offset) % element == 0);
}

// Why the range does not fit (empty if it does).
std::string check_range(const char* what, const RegisteredMemory& buffer, uint32_t id,
                        uint64_t offset, uint64_t bytes, size_t element) {
  if (!buffer.error.empty()) return fmt::format("{} buffer {}: {}", what, id, buffer.error);
  if (!buffer.mapping) return fmt::format("{} buffer {} is not registered", what, id);
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, bytes, &end) || end > buffer.bytes) {
    return fmt::format("{} range [{}, +{}) lies outside buffer {} of {} bytes", what, offset, bytes,
                       id, buffer.bytes);
  }
  if (element > 0 && (reinterpret_cast<uintptr_t>(buffer.data) + offset) % element != 0) {
    return fmt::format("{} offset {} is not aligned to the {}-byte element", what, offset, element);
  }
  return {};
}

bool overlaps(const uint8_t* a, uint64_t a_bytes, const uint8_t* b, uint64_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

}  // namespace

uint64_t Submission::block_bytes() const {
  return count * ipc::dtype_bytes(dtype);
}

uint64_t Submission::send_bytes(int32_t ranks) const {
  return block_bytes() *
         (ipc::sends_a_block_per_rank(collective) ? static_cast<uint64_t>(ranks) : 1);
}

uint64_t Submission::recv_bytes(int32_t ranks) const {
  return block_bytes() *
         (ipc::receives_a_block_per_rank(collective) ? static_cast<uint64_t>(ranks) : 1);
}

Submission resolve_submission(const ipc::SubmissionEntry& entry, BufferMemo& buffers, int32_t rank,
                              int32_t ranks, std::string name_storage) {
  Submission s;
  s.name = std::move(name_storage);
  s.request = entry.request;
  const size_t name_length = std::min<size_t>(entry.name_length, ipc::kMaxTensorNameBytes);
  s.name.assign(entry.name, strnlen(entry.name, name_length));
  auto invalid = [&s](std::string message) {
    s.error = std::move(message);
    return s;
  };
  if (entry.name_length > ipc::kMaxTensorNameBytes) {
    return invalid(fmt::format("tensor name of {} bytes exceeds {}", entry.name_length,
                               ipc::kMaxTensorNameBytes));
  }
  if (s.name.empty()) return invalid("empty tensor name");

  const auto collective = ipc::parse_collective(entry.collective);
  if (!collective) return invalid(fmt::format("unknown collective {}", entry.collective));
  s.collective = *collective;
  s.grouped = (entry.flags & ipc::kFlagGrouped) != 0;
  s.group = entry.group;
  s.group_size = entry.group_size;
  if (s.grouped && s.group_size == 0) return invalid("grouped entry with a group size of 0");
  s.priority = entry.priority;
  if (s.collective == ipc::Collective::kBarrier) return s;
  if ((entry.flags & ipc::kFlagStreamOrdered) != 0) s.event_slot = entry.event_slot;

  const auto dtype = ipc::parse_dtype(entry.dtype);
  if (!dtype) return invalid(fmt::format("unknown dtype {}", entry.dtype));
  s.dtype = *dtype;
  if (ipc::reduces(s.collective)) {
    const auto op = ipc::parse_op(entry.op);
    if (!op) return invalid(fmt::format("unknown reduction op {}", entry.op));
    if (!ipc::op_reduces(*op, s.dtype)) {
      return invalid(fmt::format("{} reduces integers only, not {}", ipc::op_name(*op),
                                 ipc::dtype_name(s.dtype)));
    }
    s.op = *op;
  }
  if (s.collective == ipc::Collective::kBroadcast) {
    if (entry.root < 0 || entry.root >= ranks) {
      return invalid(fmt::format("broadcast root {} outside [0, {})", entry.root, ranks));
    }
    s.root = entry.root;
  }
  s.count = entry.count;
  const auto range =
      ipc::checked_range_bytes(s.collective, entry.count, s.dtype, static_cast<uint64_t>(ranks));
  if (!range) {
    return invalid(fmt::format("count {} overflows the size of {} elements", entry.count,
                               ipc::dtype_name(s.dtype)));
  }
  const uint64_t send_bytes = range->send;
  const uint64_t recv_bytes = range->recv;
  const size_t element = ipc::dtype_bytes(s.dtype);
  // In place (the common case): one lookup serves both.
  const RegisteredMemory& send = buffers(entry.send_buffer);
  const RegisteredMemory& recv =
      entry.recv_buffer == entry.send_buffer ? send : buffers(entry.recv_buffer);
  if (!range_fits(send, entry.send_offset, send_bytes, element)) {
    return invalid(
        check_range("send", send, entry.send_buffer, entry.send_offset, send_bytes, element));
  }
  if (!range_fits(recv, entry.recv_offset, recv_bytes, element)) {
    return invalid(
        check_range("receive", recv, entry.recv_buffer, entry.recv_offset, recv_bytes, element));
  }
  if (send.device != recv.device) {
    return invalid(fmt::format(
        "send and receive buffers must both be host memory or both lie on one device (send: "
        "{}, receive: {})",
        send.device == kHostMemory ? "host" : fmt::format("device {}", send.device),
        recv.device == kHostMemory ? "host" : fmt::format("device {}", recv.device)));
  }
  s.device = send.device;
  s.send = send.data + entry.send_offset;
  s.recv = recv.data + entry.recv_offset;
  s.send_buffer = send.mapping;
  s.recv_buffer = recv.mapping;
  // In place: the same range, or the send range at this rank's slot of the receive range
  // (allgather), or the receive range at this rank's block of the send range (reduce-scatter).
  const uint64_t rank_offset = static_cast<uint64_t>(rank) * s.block_bytes();
  bool in_place = s.send == s.recv;
  if (s.collective == ipc::Collective::kAllgather) in_place = s.send == s.recv + rank_offset;
  if (s.collective == ipc::Collective::kReduceScatter) in_place = s.recv == s.send + rank_offset;
  if (s.collective == ipc::Collective::kAllToAll) in_place = false;
  if (overlaps(s.send, send_bytes, s.recv, recv_bytes) && !in_place) {
    switch (s.collective) {
      case ipc::Collective::kAllToAll:
        return invalid("send and receive ranges overlap: an all-to-all is never in place");
      case ipc::Collective::kAllgather:
        return invalid("send range overlaps the receive range other than at this rank's slot");
      case ipc::Collective::kReduceScatter:
        return invalid("receive range overlaps the send range other than at this rank's block");
      default:
        return invalid("send and receive ranges overlap without being the same (in place)");
    }
  }
  return s;
}

}  // namespace gradsync::daemon
