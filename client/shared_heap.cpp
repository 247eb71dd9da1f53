#include "client/shared_heap.h"

#include <unistd.h>

#include <algorithm>
#include <new>

namespace gradsync::client {
namespace {
namespace bip = boost::interprocess;

// memfd pages are only backed when touched, so a generous arena costs address space only.
constexpr size_t kMinArenaBytes = 64ull << 20;
constexpr size_t kAlignment = 256;
}  // namespace

SharedHeap::SharedHeap() : owner_(::getpid()) {}

bool SharedHeap::owned_here() const {
  return ::getpid() == owner_;
}

void* SharedHeap::allocate(size_t bytes) {
  if (!owned_here()) return nullptr;
  if (bytes == 0) bytes = 1;
  const std::lock_guard lock(mutex_);
  for (auto& arena : arenas_) {
    if (void* p = arena->allocator_.allocate_aligned(bytes, kAlignment, std::nothrow)) {
      allocations_.emplace(p, bytes);
      return p;
    }
  }
  // Room for the allocator's headers and alignment slack, rounded up to pages.
  const size_t page = ipc::page_size();
  const size_t wanted = std::max(kMinArenaBytes, bytes + bytes / 16 + (64u << 10));
  const size_t arena_bytes = (wanted + page - 1) & ~(page - 1);
  try {
    auto arena = std::make_shared<Arena>();
    arena->fd_ = ipc::create_sealed_memfd("gradsync-heap", arena_bytes);
    arena->mapping_ = ipc::Mapping(arena->fd_.get(), 0, arena_bytes);
    arena->allocator_ =
        bip::managed_external_buffer(bip::create_only, arena->mapping_.data(), arena_bytes);
    void* p = arena->allocator_.allocate_aligned(bytes, kAlignment, std::nothrow);
    arenas_.push_back(std::move(arena));
    if (p != nullptr) allocations_.emplace(p, bytes);
    return p;
  } catch (const std::exception&) {
    return nullptr;
  }
}

std::optional<size_t> SharedHeap::allocation_bytes(const void* ptr) const {
  // In a child, without the lock (see deallocate).
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (owned_here()) lock.lock();
  const auto allocation = allocations_.find(ptr);
  if (allocation == allocations_.end()) return std::nullopt;
  return allocation->second;
}

bool SharedHeap::deallocate(void* ptr) {
  if (!owned_here()) {
    // A child's copy of the set says whether the parent's memory was the heap's; it is read
    // without the lock, whose copy another thread of the parent may have held as it forked.
    return allocations_.contains(ptr);
  }
  const std::lock_guard lock(mutex_);
  if (allocations_.erase(ptr) == 0) return false;
  for (auto it = arenas_.begin(); it != arenas_.end(); ++it) {
    Arena& arena = **it;
    if (!arena.contains(ptr)) continue;
    arena.allocator_.deallocate(ptr);
    // Give an arena back once it is empty, but keep one for the next allocation.
    if (arena.allocator_.all_memory_deallocated() && arenas_.size() > 1) {
      arena.released_.store(true, std::memory_order_release);
      arenas_.erase(it);
      releases_.fetch_add(1, std::memory_order_acq_rel);
    }
    return true;
  }
  return false;
}

namespace {

// The arena of `arenas` [ptr, ptr + bytes) lies wholly inside, or null.
const std::shared_ptr<SharedHeap::Arena>* find_arena(
    const std::vector<std::shared_ptr<SharedHeap::Arena>>& arenas, const void* ptr, size_t bytes) {
  for (const auto& arena : arenas) {
    if (!arena->contains(ptr)) continue;
    const auto offset = static_cast<size_t>(static_cast<const uint8_t*>(ptr) - arena->base());
    return bytes <= arena->size() - offset ? &arena : nullptr;
  }
  return nullptr;
}

}  // namespace

std::shared_ptr<const SharedHeap::Arena> SharedHeap::arena_of(const void* ptr, size_t bytes) const {
  const std::lock_guard lock(mutex_);
  const std::shared_ptr<Arena>* arena = find_arena(arenas_, ptr, bytes);
  return arena != nullptr ? *arena : nullptr;
}

bool SharedHeap::contains(const void* ptr, size_t bytes) const {
  if (!owned_here()) return find_arena(arenas_, ptr, bytes) != nullptr;
  const std::lock_guard lock(mutex_);
  return find_arena(arenas_, ptr, bytes) != nullptr;
}

}  // namespace gradsync::client
