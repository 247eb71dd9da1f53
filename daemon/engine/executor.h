// Runs a fused batch of ready collectives on the node: the batch becomes one line of bytes,
// cut into equal parts for the reduce pool, so many small tensors cost one hand-off. A batch
// runs whole, or in pieces along that line with the engine going round between them, so that
// other jobs' work is served in between (docs/qos.md).
#pragma once

#include "daemon/collectives/local/local_work.h"
#include "daemon/engine/reduce_pool.h"
#include "daemon/job/ready_unit.h"

#include <vector>

namespace gradsync::daemon {

struct BatchStats {
  uint64_t bytes = 0;  // payload bytes of the batch (per rank)
  unsigned parts = 0;  // pool parts its largest run was cut into
};

class LocalBatch {
 public:
  explicit LocalBatch(std::vector<ReadyUnit> units);

  uint64_t bytes() const { return stats_.bytes; }
  uint64_t left() const { return stats_.bytes - done_; }
  bool finished() const { return done_ == stats_.bytes; }
  // Runs the next `bytes` of the line (at least one element, all if less is left); in parts
  // on the pool where that is at least `parallel_min_bytes` twice.
  void run(uint64_t bytes, ReducePool& pool, uint64_t parallel_min_bytes);
  // Once finished: completes every submission.
  void complete();
  const BatchStats& stats() const { return stats_; }
  std::vector<ReadyUnit>& units() { return units_; }

 private:
  std::vector<ReadyUnit> units_;
  std::vector<LocalWork> works_;
  BatchStats stats_;
  uint64_t done_ = 0;  // bytes of the line run so far
};

// Executes the batch whole and completes every submission in it.
BatchStats execute_batch(std::vector<ReadyUnit>& batch, ReducePool& pool,
                         uint64_t parallel_min_bytes);

}  // namespace gradsync::daemon
