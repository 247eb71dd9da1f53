// The mapping cache's rules, on the host mapper with real memfds (no GPU needed): hits and
// misses, mappings held across eviction and unregistration by work in flight, LRU eviction of
// what no work holds, invalidation on unregister and on the client leaving, and a buffer id
// registered again with other memory. Mappings are counted in /proc/self/maps, not assumed.
#include "daemon/memory/mapping_cache.h"
#include "daemon/memory/host_mapper.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

namespace gradsync::daemon {
namespace {

constexpr uint64_t kBytes = 3 * 4096 + 100;  // not page-aligned: the mapper rounds to pages

// A memfd named `name` whose first bytes say `text`.
HostHandle memory(const std::string& name, const std::string& text) {
  ipc::UniqueFd fd = ipc::create_sealed_memfd(name.c_str(), kBytes);
  const auto mapping = map_host_range(fd.get(), 0, kBytes);
  std::memcpy(mapping->data, text.c_str(), text.size() + 1);
  return host_handle(std::move(fd), 0, kBytes);
}

std::string text_of(const std::shared_ptr<const HostBuffer>& buffer) {
  return reinterpret_cast<const char*>(buffer->data);
}

// This process's mappings of memfds whose name starts with `prefix`.
size_t mappings_of(const std::string& prefix) {
  std::ifstream maps("/proc/self/maps");
  size_t count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:" + prefix) != std::string::npos) ++count;
  }
  return count;
}

using Cache = MappingCache<HostMapper>;

TEST(MappingCache, MissThenHitAndUnregistered) {
  Cache cache(HostMapper{}, 8);
  cache.add({1, 7}, memory("mc-hit", "seven"));
  EXPECT_EQ(cache.mapped(), 0u) << "mapped on first use";
  EXPECT_EQ(text_of(cache.acquire({1, 7})), "seven");
  EXPECT_EQ(text_of(cache.acquire({1, 7})), "seven");
  EXPECT_EQ(cache.acquire({1, 8}), nullptr);
  EXPECT_EQ(cache.acquire({2, 7}), nullptr) << "keys are per client";
  EXPECT_EQ(cache.counters().misses, 1u);
  EXPECT_EQ(cache.counters().hits, 1u);
  EXPECT_EQ(cache.counters().unregistered, 2u);
  EXPECT_EQ(mappings_of("mc-hit"), 1u);
}

TEST(MappingCache, EvictsTheLeastRecentlyUsedThatNoWorkHolds) {
  Cache cache(HostMapper{}, 2);
  cache.add({1, 1}, memory("mc-lru-a", "a"));
  cache.add({1, 2}, memory("mc-lru-b", "b"));
  cache.add({1, 3}, memory("mc-lru-c", "c"));
  cache.acquire({1, 1});
  cache.acquire({1, 2});
  cache.acquire({1, 1});  // b is now the least recently used
  cache.acquire({1, 3});
  EXPECT_EQ(cache.mapped(), 2u);
  EXPECT_EQ(cache.counters().evictions, 1u);
  EXPECT_EQ(mappings_of("mc-lru-b"), 0u) << "b was unmapped";
  EXPECT_EQ(mappings_of("mc-lru-a"), 1u);
  // Evicted, not forgotten: the next use maps it again, with the memory's current content.
  EXPECT_EQ(text_of(cache.acquire({1, 2})), "b");
  EXPECT_EQ(cache.counters().misses, 4u);
  EXPECT_EQ(cache.registered(), 3u);
}

TEST(MappingCache, MemoryInUseIsNeverUnmapped) {
  Cache cache(HostMapper{}, 1);
  cache.add({1, 1}, memory("mc-use-a", "a"));
  cache.add({1, 2}, memory("mc-use-b", "b"));
  auto in_flight = cache.acquire({1, 1});  // a collective holds a
  auto other = cache.acquire({1, 2});      // and b: both stay, over capacity
  EXPECT_EQ(cache.mapped(), 2u);
  EXPECT_EQ(cache.counters().evictions, 0u);
  other.reset();
  cache.acquire({1, 1});  // b is free now: evicted to get back within capacity
  EXPECT_EQ(cache.mapped(), 1u);
  EXPECT_EQ(mappings_of("mc-use-b"), 0u);
  // Unregistered and the client gone while the collective still runs: a stays mapped for it.
  cache.remove({1, 1});
  cache.remove_client(1);
  EXPECT_EQ(cache.acquire({1, 1}), nullptr);
  EXPECT_EQ(text_of(in_flight), "a");
  EXPECT_EQ(mappings_of("mc-use-a"), 1u);
  in_flight.reset();  // the collective completed
  EXPECT_EQ(mappings_of("mc-use-a"), 0u);
}

TEST(MappingCache, UnregisterAndClientDeathInvalidate) {
  Cache cache(HostMapper{}, 8);
  cache.add({1, 1}, memory("mc-inv-1a", "1a"));
  cache.add({1, 2}, memory("mc-inv-1b", "1b"));
  cache.add({2, 1}, memory("mc-inv-2a", "2a"));
  for (const MappingKey key : {MappingKey{1, 1}, MappingKey{1, 2}, MappingKey{2, 1}}) {
    cache.acquire(key);
  }
  cache.remove({1, 2});
  EXPECT_EQ(cache.acquire({1, 2}), nullptr);
  EXPECT_EQ(mappings_of("mc-inv-1b"), 0u);
  cache.remove_client(1);
  EXPECT_EQ(cache.acquire({1, 1}), nullptr);
  EXPECT_EQ(mappings_of("mc-inv-1a"), 0u);
  EXPECT_EQ(text_of(cache.acquire({2, 1})), "2a") << "another client's entries stay";
  EXPECT_EQ(cache.registered(), 1u);
}

TEST(MappingCache, ABufferIdRegisteredAgainWithOtherMemoryIsNotTheOldMapping) {
  Cache cache(HostMapper{}, 8);
  HostHandle first = memory("mc-reuse-old", "old");
  cache.add({1, 5}, first);
  auto before = cache.acquire({1, 5});
  cache.add({1, 5}, first);  // the same memory again: nothing changes
  EXPECT_EQ(cache.acquire({1, 5}), before);
  EXPECT_EQ(cache.counters().replaced, 0u);
  // The client freed it and registered other memory under the same id (for device memory,
  // perhaps at the same address): the handles differ, so the old mapping is not served.
  cache.add({1, 5}, memory("mc-reuse-new", "new"));
  EXPECT_EQ(cache.counters().replaced, 1u);
  EXPECT_EQ(text_of(cache.acquire({1, 5})), "new");
  EXPECT_EQ(text_of(before), "old") << "work in flight on the old memory keeps it";
  before.reset();
  EXPECT_EQ(mappings_of("mc-reuse-old"), 0u);
}

TEST(MappingCache, APremappedRegistrationIsAHitAndMapsOnlyItsPages) {
  Cache cache(HostMapper{}, 8);
  ipc::UniqueFd fd = ipc::create_sealed_memfd("mc-pre", size_t{16} * 4096);
  auto premapped = map_host_range(fd.get(), 4096 + 8, 100);
  EXPECT_EQ(premapped->mapping.size(), 4096u) << "one page holds the range";
  cache.add({1, 1}, host_handle(std::move(fd), 4096 + 8, 100), premapped);
  EXPECT_EQ(cache.acquire({1, 1}), premapped);
  EXPECT_EQ(cache.counters().hits, 1u);
  EXPECT_EQ(cache.counters().misses, 0u);
}

}  // namespace
}  // namespace gradsync::daemon
