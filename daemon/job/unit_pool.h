// Storage of a job's finished collectives, kept for the next ones. The same tensors come back
// every step, and each one would otherwise allocate and free, per step, its submissions' names,
// its list of ranks and its unit's list of collectives: with a hundred small tensors a step,
// those allocations were a large share of the engine's work. Engine-thread only.
#pragma once

#include "daemon/job/ready_unit.h"

#include <string>
#include <utility>
#include <vector>

namespace gradsync::daemon {

class UnitPool {
 public:
  // Empty, with the capacity of an earlier use where there is one.
  std::string name() { return take(names_); }
  std::vector<Submission> ranks() { return take(ranks_); }
  std::vector<ReadyCollective> collectives() { return take(collectives_); }

  // Takes back a unit whose ranks have been completed. Its buffers' mappings are released now,
  // as they would be if it were destroyed.
  void recycle(ReadyUnit&& unit) {
    for (ReadyCollective& collective : unit.collectives) {
      for (Submission& submission : collective.ranks) keep(names_, submission.name);
      keep(ranks_, collective.ranks);
    }
    keep(collectives_, unit.collectives);
  }

  // Of each kind: enough for the largest models' tensors per step; beyond it, storage is
  // freed as before.
  static constexpr size_t kMaxSpare = 4096;

 private:
  template <typename T>
  static T take(std::vector<T>& spare) {
    if (spare.empty()) return T{};
    T taken = std::move(spare.back());
    spare.pop_back();
    return taken;
  }
  template <typename T>
  static void keep(std::vector<T>& spare, T& storage) {  // leaves `storage` empty
    storage.clear();  // destroys what it held; keeps the capacity
    if (spare.size() < kMaxSpare && storage.capacity() > 0) spare.push_back(std::move(storage));
  }

  std::vector<std::string> names_;
  std::vector<std::vector<Submission>> ranks_;
  std::vector<std::vector<ReadyCollective>> collectives_;
};

}  // namespace gradsync::daemon
