#include "client/shared_heap.h"

#include <algorithm>
#include <new>

namespace gradsync::client {
namespace {
namespace bip = boost::interprocess;

// memfd pages are only backed when touched, so a generous arena costs address space only.
constexpr size_t kMinArenaBytes = 64ull << 20;
constexpr size_t kAlignment = 256;
}  // namespace

void* SharedHeap::allocate(size_t bytes) {
  if (bytes == 0) bytes = 1;
  for (auto& arena : arenas_) {
    if (void* p = arena->allocator.allocate_aligned(bytes, kAlignment, std::nothrow)) return p;
  }
  // Room for the allocator's headers and alignment slack, rounded up to pages.
  const size_t page = ipc::page_size();
  const size_t wanted = std::max(kMinArenaBytes, bytes + bytes / 16 + (64u << 10));
  const size_t arena_bytes = (wanted + page - 1) & ~(page - 1);
  try {
    auto arena = std::make_unique<Arena>();
    arena->fd = ipc::create_sealed_memfd("gradsync-heap", arena_bytes);
    arena->mapping = ipc::Mapping(arena->fd.get(), 0, arena_bytes);
    arena->allocator =
        bip::managed_external_buffer(bip::create_only, arena->mapping.data(), arena_bytes);
    void* p = arena->allocator.allocate_aligned(bytes, kAlignment, std::nothrow);
    arenas_.push_back(std::move(arena));
    return p;
  } catch (const std::exception&) {
    return nullptr;
  }
}

bool SharedHeap::deallocate(void* ptr) {
  for (auto it = arenas_.begin(); it != arenas_.end(); ++it) {
    Arena& arena = **it;
    if (!arena.contains(ptr)) continue;
    arena.allocator.deallocate(ptr);
    // Give an arena back once it is empty, but keep one for the next allocation.
    if (arena.allocator.all_memory_deallocated() && arenas_.size() > 1) arenas_.erase(it);
    return true;
  }
  return false;
}

std::optional<SharedHeap::Location> SharedHeap::locate(const void* ptr, size_t bytes) const {
  for (const auto& arena : arenas_) {
    if (!arena->contains(ptr)) continue;
    const auto* base = static_cast<const uint8_t*>(arena->mapping.data());
    const auto offset = static_cast<uint64_t>(static_cast<const uint8_t*>(ptr) - base);
    if (bytes > arena->mapping.size() - offset) return std::nullopt;
    return Location{arena->fd.get(), offset, arena->mapping.size()};
  }
  return std::nullopt;
}

}  // namespace gradsync::client
