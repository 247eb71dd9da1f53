// Runs a fused batch of ready collectives on the node: the batch becomes one line of bytes,
// cut into equal parts for the reduce pool, so many small tensors cost one hand-off. It runs in
// pieces along that line, the engine going round between them, so that other jobs' work is
// served in between (docs/qos.md).
#pragma once

#include "daemon/collectives/local/local_work.h"
#include "daemon/engine/reduce_pool.h"
#include "daemon/job/ready_unit.h"

#include <vector>

namespace gradsync::daemon {

class LocalBatch {
 public:
  explicit LocalBatch(std::vector<ReadyUnit> units);

  uint64_t bytes() const { return bytes_; }  // payload bytes (per rank)
  uint64_t left() const { return bytes_ - done_; }
  bool finished() const { return done_ == bytes_; }
  // Runs the next `bytes` of the line (at least one element, all if less is left); in parts
  // on the pool where that is at least `parallel_min_bytes` twice.
  void run(uint64_t bytes, ReducePool& pool, uint64_t parallel_min_bytes);
  // Once finished: completes every submission.
  void complete();
  std::vector<ReadyUnit>& units() { return units_; }

 private:
  std::vector<ReadyUnit> units_;
  std::vector<LocalWork> works_;
  uint64_t bytes_ = 0;
  uint64_t done_ = 0;  // bytes of the line run so far
};

}  // namespace gradsync::daemon
