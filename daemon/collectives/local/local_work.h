// A collective among a node's ranks, described as a line of work elements that can be cut at
// any element: the executor splits a fused batch across the reduce pool by bytes, without
// knowing which collective a piece belongs to. One file per collective (local_*.cpp).
#pragma once

#include "daemon/job/ready_unit.h"

#include <cstdint>
#include <functional>

namespace gradsync::daemon {

// `run` captures at most two words, so std::function keeps it inline (no allocation).
struct LocalWork {
  uint64_t elements = 0;
  size_t element_bytes = 1;
  std::function<void(uint64_t begin, uint64_t end)> run;  // runs elements [begin, end)
};

// Reduce every rank's send range and write the result to every rank's receive range.
LocalWork local_allreduce(const ReadyCollective& collective);
// Copy the root's send range to every rank's receive range.
LocalWork local_broadcast(const ReadyCollective& collective);
// Copy every rank's send range into slot r of every rank's receive range.
LocalWork local_allgather(const ReadyCollective& collective);
// Reduce block j of every rank's send range into rank j's receive range.
LocalWork local_reduce_scatter(const ReadyCollective& collective);
// Copy block j of rank i's send range to block i of rank j's receive range.
LocalWork local_alltoall(const ReadyCollective& collective);

LocalWork local_work_for(const ReadyCollective& collective);

}  // namespace gradsync::daemon
