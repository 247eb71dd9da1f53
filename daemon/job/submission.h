// A ring entry turned into a collective the engine can run: validated and resolved to pointers
// into the daemon's mappings. This is the boundary for everything a client writes on its ring.
#pragma once

#include "daemon/device/device_streams.h"
#include "daemon/job/session.h"
#include "daemon/memory/host_mapper.h"
#include "daemon/memory/mapping_cache.h"
#include "ipc/protocol.h"
#include "ipc/segment.h"

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

namespace gradsync::daemon {

// Where a submission's memory is: host memory, or the ordinal of the device it lies on.
inline constexpr int kHostMemory = -1;

// A registered buffer as a submission sees it, kept mapped by `mapping`.
struct RegisteredMemory {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  int device = kHostMemory;
  std::shared_ptr<const void> mapping;  // null: nothing registered under the id
  std::string error;                    // registered, but could not be mapped now

  RegisteredMemory() = default;
  // Host memory (implicit: a lookup of host buffers is a lookup of registered memory).
  template <typename Buffer>
  RegisteredMemory(std::shared_ptr<Buffer> host)  // NOLINT(google-explicit-constructor)
      : data(host ? host->data : nullptr), bytes(host ? host->bytes : 0), mapping(std::move(host)) {
    static_assert(std::is_convertible_v<Buffer*, const HostBuffer*>);
  }
};

struct Submission {
  Session* session = nullptr;  // the engine purges a session's submissions before freeing it
  uint64_t request = 0;
  std::string name;
  ipc::Collective collective = ipc::Collective::kBarrier;
  gradsync_dtype dtype = GRADSYNC_FLOAT32;
  gradsync_op op = GRADSYNC_SUM;
  int32_t root = 0;
  uint64_t count = 0;
  bool grouped = false;
  uint64_t group = 0;
  uint32_t group_size = 0;
  int32_t priority = 0;  // higher runs first (docs/priority.md)
  const uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  // kHostMemory, or the device both ranges lie on (device pointers in the daemon's space).
  int device = kHostMemory;
  // Ordered on the rank's stream (ipc::kFlagStreamOrdered): its event slot, and its events
  // (set by the engine, which checks the slot); -1 otherwise.
  int64_t event_slot = -1;
  std::shared_ptr<const ClientEvents> events;
  // Keep the mappings alive while the collective is in flight, even if the client unregisters.
  std::shared_ptr<const void> send_buffer;
  std::shared_ptr<const void> recv_buffer;
  // Non-empty when the entry is invalid. The submission still takes part in negotiation so that
  // the other ranks of the job fail fast instead of waiting for it.
  std::string error;

  bool valid() const { return error.empty(); }
  // `count` elements: what a rank sends (and receives but for allgather and reduce-scatter);
  // an allgather's slot and a reduce-scatter's block.
  uint64_t block_bytes() const;
  // The ranges: an allgather receives a block from each of `ranks` ranks, a reduce-scatter
  // sends one to each, an all-to-all both.
  uint64_t send_bytes(int32_t ranks) const;
  uint64_t recv_bytes(int32_t ranks) const;
};

// Completes this rank's part of the collective.
inline void complete(const Submission& s, gradsync_result status, std::string_view message = {}) {
  s.session->complete(s.request, s.collective, status, message);
}

using BufferLookup = std::function<RegisteredMemory(uint32_t id)>;

// The buffers one look at a ring has resolved. A framework registers a few buffers and submits
// every tensor from them, so a look resolves each id once (a mapping cache lookup) instead of
// once per submission. Valid for one look only: registrations change between looks.
class BufferMemo {
 public:
  explicit BufferMemo(BufferLookup lookup) : lookup_(std::move(lookup)) {}

  // Valid until the second lookup after this one (a send and a receive buffer stay together).
  const RegisteredMemory& operator()(uint32_t id) {
    for (size_t i = 0; i < used_; ++i) {
      if (entries_[i].id == id) {
        const RegisteredMemory& memory = entries_[last_ = i].memory;
        // What the mapping cache would have counted, had it been asked again.
        if (memory.error.empty()) ++(memory.mapping ? repeats_.hits : repeats_.unregistered);
        return memory;
      }
    }
    size_t slot = used_;
    if (used_ < kEntries) {
      ++used_;
    } else {
      slot = (last_ + 1) % kEntries;  // never the one handed out last
    }
    entries_[slot] = {id, lookup_(id)};
    return entries_[last_ = slot].memory;
  }

  // Lookups answered here instead of by the mapping cache, as the cache would have counted
  // them (hits and unregistered ids): its metrics count a lookup per submission.
  const MappingCounters& repeats() const { return repeats_; }

 private:
  static constexpr size_t kEntries = 4;
  struct Entry {
    uint32_t id = 0;
    RegisteredMemory memory;
  };
  BufferLookup lookup_;
  std::array<Entry, kEntries> entries_;
  size_t used_ = 0;
  size_t last_ = 0;
  MappingCounters repeats_;
};

// Validates every field of `entry` and resolves its buffers. Never throws on bad input.
// `rank` and `ranks` number the job's ranks as roots and allgather slots do (local ranks in a
// single-node job, global ranks across nodes). In place means send == recv, or for allgather
// send == recv + rank * count, or for reduce-scatter recv == send + rank * count; an
// all-to-all is never in place. `name_storage`: a
// string whose capacity the name may reuse.
Submission resolve_submission(const ipc::SubmissionEntry& entry, BufferMemo& buffers, int32_t rank,
                              int32_t ranks, std::string name_storage = {});
// The same, for one entry (tests, fuzzing).
inline Submission resolve_submission(const ipc::SubmissionEntry& entry, BufferLookup lookup,
                                     int32_t rank, int32_t ranks) {
  BufferMemo buffers(std::move(lookup));
  return resolve_submission(entry, buffers, rank, ranks);
}

}  // namespace gradsync::daemon
