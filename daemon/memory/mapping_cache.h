// The daemon's mappings of its clients' memory (the "pointer cache" of CUDA-aware MPI), generic
// over how memory is mapped: host shared memory (HostMapper) or device memory through CUDA IPC.
//
// Rules:
//  - keyed by (client, buffer id); a registration remembers the client's handle, and the
//    memory is mapped on first use (a miss) or handed in already mapped;
//  - refcounted: acquire() returns a shared pointer, and work in flight that holds one keeps the
//    mapping alive whatever happens to its entry meanwhile (eviction, unregistration, the
//    client leaving): memory is never unmapped under a collective;
//  - bounded: past `capacity` mappings, the least recently used one that no work holds is
//    unmapped (its registration stays: the next use maps it again); an entry in use is never
//    evicted, since mapping the same memory twice fails for CUDA IPC;
//  - a registration of a buffer id with another handle (the client freed the memory and got
//    other memory, perhaps at the same address) drops the old mapping: handles are compared
//    (Mapper::same), never addresses;
//  - invalidated when the client unregisters the buffer, or leaves.
//
// A Mapper provides `Handle` (copyable), `Mapping`, `std::shared_ptr<const Mapping>
// map(const Handle&)` (throws when it cannot) and `static bool same(const Handle&, const
// Handle&)`. Engine-thread only.
#pragma once

#include <cstdint>
#include <iterator>
#include <list>
#include <memory>
#include <unordered_map>
#include <utility>

namespace gradsync::daemon {

struct MappingKey {
  uint64_t client = 0;
  uint32_t buffer = 0;
  bool operator==(const MappingKey&) const = default;
};

struct MappingKeyHash {
  size_t operator()(const MappingKey& key) const {
    return std::hash<uint64_t>{}(key.client * 0x9e3779b97f4a7c15ull ^ key.buffer);
  }
};

struct MappingCounters {
  uint64_t hits = 0;          // acquired, already mapped
  uint64_t misses = 0;        // acquired, mapped now
  uint64_t unregistered = 0;  // acquired, no such registration
  uint64_t evictions = 0;     // unmapped for room, registration kept
  uint64_t replaced = 0;      // registered again with another handle
};

template <typename Mapper>
class MappingCache {
 public:
  using Handle = typename Mapper::Handle;
  using Mapping = typename Mapper::Mapping;

  MappingCache(Mapper mapper, size_t capacity) : mapper_(std::move(mapper)), capacity_(capacity) {}

  // Registers `handle` under `key`, with its mapping if the caller made one already. The same
  // handle again keeps the entry as it is; another handle replaces it.
  void add(const MappingKey& key, const Handle& handle,
           std::shared_ptr<const Mapping> mapped = nullptr) {
    if (auto it = entries_.find(key); it != entries_.end()) {
      if (Mapper::same(it->second.handle, handle)) return;
      ++counters_.replaced;
      erase(it);
    }
    Entry& entry = entries_[key];
    entry.handle = handle;
    if (mapped) {
      entry.mapping = std::move(mapped);
      touch(key, entry);
      evict_beyond_capacity();
    }
  }

  void remove(const MappingKey& key) {
    if (auto it = entries_.find(key); it != entries_.end()) erase(it);
  }

  void remove_client(uint64_t client) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->first.client == client) {
        it = erase(it);
      } else {
        ++it;
      }
    }
  }

  // The mapping registered under `key`, mapped now if need be; null when nothing is registered
  // there. Throws what the mapper throws.
  std::shared_ptr<const Mapping> acquire(const MappingKey& key) {
    const auto it = entries_.find(key);
    if (it == entries_.end()) {
      ++counters_.unregistered;
      return nullptr;
    }
    Entry& entry = it->second;
    if (entry.mapping) {
      ++counters_.hits;
    } else {
      entry.mapping = mapper_.map(entry.handle);
      ++counters_.misses;
    }
    touch(key, entry);
    std::shared_ptr<const Mapping> mapping = entry.mapping;
    evict_beyond_capacity();
    return mapping;
  }

  size_t registered() const { return entries_.size(); }
  size_t mapped() const { return lru_.size(); }
  const MappingCounters& counters() const { return counters_; }
  const Mapper& mapper() const { return mapper_; }

 private:
  struct Entry {
    Handle handle;
    std::shared_ptr<const Mapping> mapping;  // null: not mapped now
    bool listed = false;                     // in lru_, at `recency` (while mapped)
    typename std::list<MappingKey>::iterator recency;
  };
  using Entries = std::unordered_map<MappingKey, Entry, MappingKeyHash>;

  // Most recently used first. A hit moves its node to the front (no allocation: every
  // submission's buffers come this way).
  void touch(const MappingKey& key, Entry& entry) {
    if (entry.listed) {
      lru_.splice(lru_.begin(), lru_, entry.recency);
      return;
    }
    lru_.push_front(key);
    entry.recency = lru_.begin();
    entry.listed = true;
  }

  typename Entries::iterator erase(typename Entries::iterator it) {
    if (it->second.listed) lru_.erase(it->second.recency);
    return entries_.erase(it);  // work in flight keeps its own reference
  }

  void evict_beyond_capacity() {
    auto candidate = lru_.end();
    while (lru_.size() > capacity_ && candidate != lru_.begin()) {
      --candidate;
      Entry& entry = entries_.at(*candidate);
      if (entry.mapping.use_count() > 1) continue;  // in use: never unmapped under it
      entry.mapping.reset();
      entry.listed = false;
      candidate = lru_.erase(candidate);
      ++counters_.evictions;
    }
  }

  Mapper mapper_;
  size_t capacity_;
  Entries entries_;
  std::list<MappingKey> lru_;  // keys of the mapped entries
  MappingCounters counters_;
};

}  // namespace gradsync::daemon
