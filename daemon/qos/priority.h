// Priorities between one job's collectives (docs/priority.md). A rank gives each collective a
// priority (gradsync_set_priority); of a job's collectives waiting to run, the one of highest
// rank goes first. A waiting collective ages: its rank rises as by one priority for every
// kPriorityAgingStep of its job's collectives queued after it, so none starves under a stream
// of higher-priority ones, and of equal priorities the older goes first. Age is counted in
// collectives rather than time so that every node of a job ranks two collectives alike: the
// difference of their ages is the same everywhere, which the nodes' sends rely on (PaceWait).
#pragma once

#include <cstdint>

namespace gradsync::daemon {

inline constexpr int64_t kPriorityAgingStep = 16;

// The rank of a collective of `priority` that was the `order`-th of its job queued.
constexpr int64_t priority_rank(int32_t priority, uint64_t order) {
  return int64_t{priority} * kPriorityAgingStep - static_cast<int64_t>(order);
}

// A collective's priority and rank, where one of another priority may hold it back.
struct Ranked {
  int32_t priority = 0;
  int64_t rank = 0;
  // `other` goes first: it ranks higher, with another priority. (Of one priority, several
  // run at once, first in, first out: that keeps the links busy between collectives.)
  constexpr bool held_back_by(const Ranked& other) const {
    return other.priority != priority && other.rank > rank;
  }
};

}  // namespace gradsync::daemon
