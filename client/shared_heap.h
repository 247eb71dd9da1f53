// Host memory the daemon can map: arenas of sealed memfds, carved up by a Boost.Interprocess
// allocator whose bookkeeping lives inside the arena (the daemon never reads it: it maps only
// registered ranges).
#pragma once

#include "ipc/system.h"

#include <boost/interprocess/managed_external_buffer.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace gradsync::client {

class SharedHeap {
 public:
  struct Location {
    int fd;           // the arena's memfd
    uint64_t offset;  // of the address within the arena
    uint64_t arena_bytes;
  };

  // Returns nullptr when the memory cannot be had. 256-byte aligned.
  void* allocate(size_t bytes);
  // False when `ptr` is not an allocation of this heap.
  bool deallocate(void* ptr);
  // Where [ptr, ptr + bytes) lives, if wholly inside one arena.
  std::optional<Location> locate(const void* ptr, size_t bytes) const;

 private:
  struct Arena {
    ipc::UniqueFd fd;
    ipc::Mapping mapping;
    boost::interprocess::managed_external_buffer allocator;
    bool contains(const void* p) const {
      const auto* base = static_cast<const uint8_t*>(mapping.data());
      return p >= base && p < base + mapping.size();
    }
  };
  std::vector<std::unique_ptr<Arena>> arenas_;
};

}  // namespace gradsync::client
