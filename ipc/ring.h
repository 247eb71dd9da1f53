// A single-producer single-consumer ring of fixed-size entries that lives in shared memory.
//
// The two sides are different processes and may distrust each other: the consumer copies an
// entry out before it looks at it, and each side keeps its own index privately and only reads
// the other side's published index, clamping what it sees. A corrupt index from the other side
// can make a ring look empty or full, never make this side read or write outside the ring.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace gradsync::ipc {

inline constexpr size_t kCacheLine = 64;

// The shared part: two published indices on their own cache lines, then the entries.
template <typename Entry>
struct RingShared {
  static_assert(std::is_trivially_copyable_v<Entry>);
  alignas(kCacheLine) std::atomic<uint64_t> produced;  // written by the producer only
  alignas(kCacheLine) std::atomic<uint64_t> consumed;  // written by the consumer only
  alignas(kCacheLine) Entry entries[1];                // really `capacity` entries

  static size_t bytes_for(uint32_t capacity) {
    return offsetof(RingShared, entries) + sizeof(Entry) * capacity;
  }
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "ring indices must be address-free atomics to work across processes");

template <typename Entry>
class RingProducer {
 public:
  RingProducer() = default;
  RingProducer(RingShared<Entry>* shared, uint32_t capacity)
      : shared_(shared),
        capacity_(capacity),
        produced_(shared->produced.load()),
        consumed_seen_(shared->consumed.load()) {}

  // Free slots as this side sees them.
  uint64_t free_slots() const {
    return free_after(shared_->consumed.load(std::memory_order_acquire));
  }

  // Publishes the first `bytes` of `entry`; the rest of its slot keeps what an earlier lap
  // left there, which consumers do not read (segment.h, used_bytes). Every cache line written
  // here is one the other side's core has to fetch again: for a small collective, the ring's
  // share of the cost.
  //
  // `publish`: the order of the index's store. Release is enough for the entry; a producer
  // that next looks at a flag its consumer raises before it sleeps (and then looks at the
  // ring) needs seq_cst, and pays a full fence for it: the fence waits for the slot's lines,
  // which the consumer's core holds.
  bool try_push(const Entry& entry, size_t bytes = sizeof(Entry),
                std::memory_order publish = std::memory_order_release) {
    // The consumer's index is read again only when the last one read leaves no room: it is
    // on a line the consumer writes, a miss whenever it moved.
    if (free_after(consumed_seen_) == 0) {
      consumed_seen_ = shared_->consumed.load(std::memory_order_acquire);
      if (free_after(consumed_seen_) == 0) return false;
    }
    std::memcpy(&shared_->entries[produced_ % capacity_], &entry, std::min(bytes, sizeof(Entry)));
    ++produced_;
    shared_->produced.store(produced_, publish);
    return true;
  }

  uint32_t capacity() const { return capacity_; }

 private:
  uint64_t free_after(uint64_t consumed) const {
    const uint64_t used = produced_ - consumed;
    return used > capacity_ ? 0 : capacity_ - used;  // corrupt index: look full
  }

  RingShared<Entry>* shared_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t produced_ = 0;
  uint64_t consumed_seen_ = 0;  // the consumer's index when last read
};

template <typename Entry>
class RingConsumer {
 public:
  RingConsumer() = default;
  RingConsumer(RingShared<Entry>* shared, uint32_t capacity)
      : shared_(shared),
        capacity_(capacity),
        consumed_(shared->consumed.load()),
        produced_seen_(consumed_) {}

  // Entries available as this side sees them. Sequentially consistent, for a consumer that
  // raised a flag before it looks (a plain load on x86, as an acquire one is).
  uint64_t available() const {
    return ready_before(shared_->produced.load(std::memory_order_seq_cst));
  }

  // Copies the next entry out (so the producer cannot change it under us) and frees its slot.
  bool try_pop(Entry& out) {
    // As the producer: the other side's index is read again only when the last one is used up.
    if (ready_before(produced_seen_) == 0) {
      produced_seen_ = shared_->produced.load(std::memory_order_acquire);
      if (ready_before(produced_seen_) == 0) return false;
    }
    std::memcpy(&out, &shared_->entries[consumed_ % capacity_], sizeof(Entry));
    ++consumed_;
    shared_->consumed.store(consumed_, std::memory_order_release);
    return true;
  }

  uint32_t capacity() const { return capacity_; }

 private:
  uint64_t ready_before(uint64_t produced) const {
    const uint64_t ready = produced - consumed_;
    return ready > capacity_ ? 0 : ready;  // corrupt index: look empty
  }

  RingShared<Entry>* shared_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t consumed_ = 0;
  uint64_t produced_seen_ = 0;  // the producer's index when last read
};

}  // namespace gradsync::ipc
