// A communicator's requests: submitted ones waiting for their completion, and finished ones
// waiting for the caller to take their outcome. Ids are handed out in ascending order and are
// mostly taken in that order, so the table is a window over the ids from the oldest one not
// yet taken: a slot per id, storage kept between steps. (Hash tables allocated a node per
// request and another per outcome, for each of a step's hundred small tensors.) A request
// left untaken for long (a caller that never waits on it) moves out of the window, to a table
// of its own, so that it does not hold every later id in the window.
#pragma once

#include <gradsync/gradsync.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gradsync::client {

class RequestTable {
 public:
  enum class State : uint8_t { kUnknown, kPending, kFinished };
  struct Outcome {
    gradsync_result status = GRADSYNC_OK;
    std::string message;
  };

  // A request submitted now; ids come in ascending order (gaps are allowed).
  void add(uint64_t id) {
    if (head_ == slots_.size()) {  // empty: the window starts here
      clear();
      first_ = id;
    }
    while (end_id() < id) slots_.emplace_back();  // ids never added stay unknown
    slots_.emplace_back().state = State::kPending;
    if (slots_.size() - head_ > kMaxWindow) {
      Slot& oldest = slots_[head_];
      if (oldest.state != State::kUnknown) stragglers_.emplace(first_, std::move(oldest));
      forget(oldest);
    }
  }

  State state(uint64_t id) const {
    if (in_window(id)) return slots_[index(id)].state;
    const auto it = stragglers_.find(id);
    return it == stragglers_.end() ? State::kUnknown : it->second.state;
  }
  bool pending(uint64_t id) const { return state(id) == State::kPending; }
  bool finished(uint64_t id) const { return state(id) == State::kFinished; }
  // Slots in the window (for tests: it stays small whatever is left untaken).
  size_t window() const { return slots_.size() - head_; }

  // Records a pending request's outcome; false (nothing changes) for any other id.
  bool finish(uint64_t id, gradsync_result status, std::string_view message) {
    Slot* slot = in_window(id) ? &slots_[index(id)] : find_straggler(id);
    if (slot == nullptr || slot->state != State::kPending) return false;
    slot->state = State::kFinished;
    slot->outcome.status = status;
    slot->outcome.message.assign(message);
    return true;
  }

  // Hands back a finished request's outcome and forgets the request.
  Outcome take(uint64_t id) {
    if (in_window(id)) {
      Slot& slot = slots_[index(id)];
      Outcome outcome = std::move(slot.outcome);
      forget(slot);
      return outcome;
    }
    const auto it = stragglers_.find(id);
    Outcome outcome = std::move(it->second.outcome);
    stragglers_.erase(it);
    return outcome;
  }

  // Forgets a pending request whose waiter gave up: its completion, if one comes, is dropped.
  void abandon(uint64_t id) {
    if (state(id) != State::kPending) return;
    if (in_window(id)) {
      forget(slots_[index(id)]);
    } else {
      stragglers_.erase(id);
    }
  }

 private:
  struct Slot {
    State state = State::kUnknown;
    Outcome outcome;
  };
  // A window whose oldest ids are forgotten is compacted once this many lead it (and they are
  // at least half of it); it empties entirely whenever every id in it is forgotten.
  static constexpr size_t kCompactAt = 64;
  // Requests in the window at most: a straggler at its head moves out beyond this.
  static constexpr size_t kMaxWindow = 4096;

  uint64_t end_id() const { return first_ + (slots_.size() - head_); }
  bool in_window(uint64_t id) const { return id >= first_ && id < end_id(); }
  size_t index(uint64_t id) const { return head_ + static_cast<size_t>(id - first_); }
  Slot* find_straggler(uint64_t id) {
    if (stragglers_.empty()) return nullptr;
    const auto it = stragglers_.find(id);
    return it == stragglers_.end() ? nullptr : &it->second;
  }
  // Marks a slot of the window unknown, and moves the window past the unknown ones it starts
  // with.
  void forget(Slot& slot) {
    slot.state = State::kUnknown;
    slot.outcome.message.clear();
    while (head_ < slots_.size() && slots_[head_].state == State::kUnknown) {
      ++head_;
      ++first_;
    }
    if (head_ == slots_.size()) {
      clear();
    } else if (head_ >= kCompactAt && head_ * 2 >= slots_.size()) {
      slots_.erase(slots_.begin(), slots_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  void clear() {
    slots_.clear();  // keeps the capacity
    head_ = 0;
  }

  std::vector<Slot> slots_;
  size_t head_ = 0;                                // slots_[head_] is id first_
  uint64_t first_ = 0;                             // the oldest id in the window
  std::unordered_map<uint64_t, Slot> stragglers_;  // by id: untaken, out of the window
};

}  // namespace gradsync::client
