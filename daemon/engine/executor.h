// Runs a fused batch of ready collectives on the node: the batch becomes one line of bytes,
// cut into equal parts for the reduce pool, so many small tensors cost one hand-off.
#pragma once

#include "daemon/engine/job.h"
#include "daemon/engine/reduce_pool.h"

#include <vector>

namespace gradsync::daemon {

struct BatchStats {
  uint64_t bytes = 0;  // payload bytes of the batch (per rank)
  unsigned parts = 0;  // pool parts it ran in
};

// Executes the batch and completes every submission in it.
BatchStats execute_batch(std::vector<ReadyUnit>& batch, ReducePool& pool,
                         uint64_t parallel_min_bytes);

}  // namespace gradsync::daemon
