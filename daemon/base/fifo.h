// A first-in, first-out queue for the per-name queues of negotiation (a tensor's submissions
// by rank, its instances waiting for the other nodes). They hold one item almost always and
// empty out every step; std::deque frees its block each time it empties and allocates one on
// the next push, which is an allocation per tensor per step. This keeps its storage.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace gradsync::daemon {

template <typename T>
class Fifo {
 public:
  bool empty() const { return head_ == items_.size(); }
  size_t size() const { return items_.size() - head_; }
  T& front() { return items_[head_]; }
  const T& front() const { return items_[head_]; }

  void push_back(T item) { items_.push_back(std::move(item)); }

  void pop_front() {
    items_[head_] = T{};  // releases what the item holds now, not when the slot is reused
    if (++head_ == items_.size()) {
      clear();
    } else if (head_ >= kCompactAt && head_ * 2 >= items_.size()) {
      // A queue that never empties (its producer stays ahead) must not grow without bound.
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }

  void clear() {
    items_.clear();  // keeps the capacity
    head_ = 0;
  }

  auto begin() { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin() + static_cast<std::ptrdiff_t>(head_); }
  auto end() const { return items_.end(); }

 private:
  static constexpr size_t kCompactAt = 16;

  std::vector<T> items_;
  size_t head_ = 0;
};

}  // namespace gradsync::daemon
