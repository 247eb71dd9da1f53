// Host memory the daemon can map: arenas of sealed memfds, carved up by a Boost.Interprocess
// allocator whose bookkeeping lives inside the arena (the daemon never reads it: it maps only
// registered ranges).
//
// A heap is thread-safe: a communicator's own heap is used by its thread only, but a heap a
// framework allocates tensors from (gradsync_heap_create) is allocated from and freed on any
// thread while the communicators attached to it look arenas up on theirs.
//
// The arenas are shared mappings, the allocator's bookkeeping inside them: a child the process
// forks (a DataLoader's worker) sees the parent's arenas, but its own copy of the lock. So a
// heap serves only the process that created it: in a child it allocates nothing, and a free
// of what the parent allocated leaves the parent's memory alone.
#pragma once

#include "ipc/system.h"

#include <sys/types.h>

#include <boost/interprocess/managed_external_buffer.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace gradsync::client {

class SharedHeap {
 public:
  // One memfd, mapped here. Shared with the communicators that registered it whole with their
  // daemon: while one holds it, its address range is not mapped again for another arena, so a
  // registration by address never names memory it was not made for.
  class Arena {
   public:
    int fd() const { return fd_.get(); }
    uint8_t* base() const { return static_cast<uint8_t*>(mapping_.data()); }
    size_t size() const { return mapping_.size(); }
    // Once the heap has let go of it (every allocation in it freed): a communicator holding
    // it unregisters it.
    bool released() const { return released_.load(std::memory_order_acquire); }
    bool contains(const void* p) const {
      return p >= base() && static_cast<const uint8_t*>(p) < base() + size();
    }

   private:
    friend class SharedHeap;
    ipc::UniqueFd fd_;
    ipc::Mapping mapping_;
    boost::interprocess::managed_external_buffer allocator_;
    std::atomic<bool> released_{false};
  };

  SharedHeap();

  // Returns nullptr when the memory cannot be had, or in a child of the creating process.
  // 256-byte aligned.
  void* allocate(size_t bytes);
  // False when `ptr` is not an allocation of this heap (in a child: was not when it forked).
  bool deallocate(void* ptr);
  // The bytes asked for when `ptr` was allocated; none when it is not an allocation of this
  // heap (in a child: was not when it forked).
  std::optional<size_t> allocation_bytes(const void* ptr) const;
  // Whether the calling process is the one that created the heap.
  bool owned_here() const;
  // The arena [ptr, ptr + bytes) lies wholly inside; null if none.
  std::shared_ptr<const Arena> arena_of(const void* ptr, size_t bytes) const;
  // Whether [ptr, ptr + bytes) lies wholly inside one arena; in a child, of those there were
  // when it forked (read without the lock, as deallocate reads).
  bool contains(const void* ptr, size_t bytes) const;
  // How many arenas the heap has let go of so far: a communicator that saw the same count
  // last time has nothing to unregister.
  uint64_t releases() const { return releases_.load(std::memory_order_acquire); }

 private:
  const pid_t owner_;  // the process that created it
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<Arena>> arenas_;
  // Their bytes, by address: a free of anything else is refused.
  std::unordered_map<const void*, size_t> allocations_;
  std::atomic<uint64_t> releases_{0};
};

}  // namespace gradsync::client
