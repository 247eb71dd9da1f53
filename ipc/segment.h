// Layout of the per-client control segment: a memfd the daemon creates, seals and hands to the
// client at connect. It holds the submission ring (client -> daemon), the completion ring
// (daemon -> client) and the doorbell words. The layout is fixed and offset-based, not a Boost
// managed segment, because the daemon must never interpret allocator metadata a client can write.
#pragma once

#include "ipc/protocol.h"
#include "ipc/ring.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

namespace gradsync::ipc {

inline constexpr uint32_t kSegmentMagic = 0x47534e43;  // "GSNC"

// One collective as a rank submits it. 256 bytes, copied out by the daemon before use.
struct SubmissionEntry {
  uint64_t request;      // client's handle, echoed in the completion
  uint8_t collective;    // Collective
  uint8_t dtype;         // gradsync_dtype
  uint8_t op;            // gradsync_op (allreduce)
  uint8_t flags;         // kFlag*
  int32_t root;          // broadcast root (local rank)
  uint32_t send_buffer;  // registered buffer ids
  uint32_t recv_buffer;
  uint64_t send_offset;  // bytes from the buffer's start
  uint64_t recv_offset;
  uint64_t count;        // elements per rank
  uint64_t group;        // client-chosen group id, when kFlagGrouped
  uint32_t group_size;   // members of the group
  uint32_t name_length;  // bytes of name used, <= kMaxTensorNameBytes
  int32_t priority;      // higher runs first (gradsync_set_priority)
  char name[kMaxTensorNameBytes + 1];
  uint32_t event_slot;  // kFlagStreamOrdered: the rank's ready event and the daemon's completion
  uint8_t reserved[24];
};
static_assert(sizeof(SubmissionEntry) == 256);
inline constexpr uint8_t kFlagGrouped = 1;
// Device memory, ordered on the rank's CUDA stream: the daemon's stream waits for the rank's
// ready event `event_slot` before touching the memory, records completion event `event_slot`
// after, and completes the request as soon as that is enqueued (the rank's stream waits on it).
inline constexpr uint8_t kFlagStreamOrdered = 2;

struct CompletionEntry {
  uint64_t request;
  uint32_t status;  // gradsync_result
  uint32_t message_length;
  char message[kMaxErrorMessageBytes + 1];
  uint8_t reserved[16];
};
static_assert(sizeof(CompletionEntry) == 256);

// How much of an entry its consumer reads, and so all its producer publishes (RingProducer::
// try_push): the fixed fields and the name (the message) as long as its length says, and a
// stream-ordered submission's event slot. A small collective's entries then take one or two
// of their four cache lines across the cores.
inline size_t used_bytes(const SubmissionEntry& entry) {
  if ((entry.flags & kFlagStreamOrdered) != 0) return sizeof(SubmissionEntry);
  return offsetof(SubmissionEntry, name) +
         std::min<size_t>(entry.name_length, sizeof(SubmissionEntry::name));
}
inline size_t used_bytes(const CompletionEntry& entry) {
  return offsetof(CompletionEntry, message) +
         std::min<size_t>(entry.message_length, sizeof(CompletionEntry::message));
}

struct SegmentHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t ring_entries;
  uint32_t reserved;
  uint64_t submission_offset;  // from the start of the segment
  uint64_t completion_offset;
  // The daemon sets this before it blocks; a client that sees it set after publishing a
  // submission takes it down and writes the doorbell eventfd. Otherwise the fast path makes no
  // system call.
  alignas(kCacheLine) std::atomic<uint32_t> daemon_sleeping;
  // Futex word bumped on every completion; the client sleeps on it after spinning.
  alignas(kCacheLine) std::atomic<uint32_t> completion_sequence;
  std::atomic<uint32_t> client_waiting;
};

struct SegmentLayout {
  uint64_t submission_offset;
  uint64_t completion_offset;
  uint64_t total_bytes;

  static SegmentLayout for_entries(uint32_t ring_entries) {
    auto align = [](uint64_t v) { return (v + 4095) & ~uint64_t{4095}; };
    SegmentLayout layout{};
    layout.submission_offset = align(sizeof(SegmentHeader));
    layout.completion_offset =
        align(layout.submission_offset + RingShared<SubmissionEntry>::bytes_for(ring_entries));
    layout.total_bytes =
        align(layout.completion_offset + RingShared<CompletionEntry>::bytes_for(ring_entries));
    return layout;
  }
};

// Writes a fresh header at `base`, a zeroed segment of SegmentLayout::for_entries(ring_entries)'s
// size: the daemon's side of creating a client's segment.
inline SegmentHeader* write_segment_header(void* base, uint32_t ring_entries) {
  const SegmentLayout layout = SegmentLayout::for_entries(ring_entries);
  auto* header = new (base) SegmentHeader{};
  header->magic = kSegmentMagic;
  header->version = kProtocolVersion;
  header->ring_entries = ring_entries;
  header->submission_offset = layout.submission_offset;
  header->completion_offset = layout.completion_offset;
  return header;
}

// Views into a mapped segment. The layout comes from the ring size both sides agreed on at
// connect, never from offsets read out of the shared header.
struct SegmentView {
  SegmentHeader* header = nullptr;
  RingShared<SubmissionEntry>* submissions = nullptr;
  RingShared<CompletionEntry>* completions = nullptr;

  static SegmentView over(void* base, uint32_t ring_entries) {
    const SegmentLayout layout = SegmentLayout::for_entries(ring_entries);
    auto* bytes = static_cast<uint8_t*>(base);
    return SegmentView{
        reinterpret_cast<SegmentHeader*>(bytes),
        reinterpret_cast<RingShared<SubmissionEntry>*>(bytes + layout.submission_offset),
        reinterpret_cast<RingShared<CompletionEntry>*>(bytes + layout.completion_offset)};
  }
};

}  // namespace gradsync::ipc
