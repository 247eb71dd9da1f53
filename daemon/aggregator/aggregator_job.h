// One job an aggregator serves (aggregator.h): its nodes, and the collectives they push
// through this aggregator, each summed a chunk at a time as its pushes arrive.
// Engine-thread only.
#pragma once

#include "daemon/links/aggregation.capnp.h"
#include "daemon/links/aggregation_plan.h"
#include "transport/transport.h"

#include <gradsync/gradsync.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::daemon {

class AggregatorJob {
 public:
  using Clock = std::chrono::steady_clock;

  struct Shape {
    std::string name;
    std::vector<std::string> nodes;        // the job's node daemons, in node order
    std::vector<transport::PeerId> peers;  // by node
    uint32_t index = 0;                    // this aggregator's place among the job's
    uint32_t aggregators = 1;
    uint64_t chunk_bytes = 0;
    uint16_t tag = 0;  // the job's name hashed, as its nodes' tags carry it
  };
  AggregatorJob(Shape shape, transport::Transport& transport);
  ~AggregatorJob();
  AggregatorJob(const AggregatorJob&) = delete;
  AggregatorJob& operator=(const AggregatorJob&) = delete;

  const Shape& shape() const { return shape_; }
  // Each node's instance of the job, as it joined (0: not yet).
  uint64_t& incarnation(uint32_t node) { return incarnations_[node]; }
  // Node `node` announced a collective it pushes: an error where it does not fit the job, or
  // what other nodes announced for it.
  std::optional<std::string> announce(uint32_t node, wire::AggregationBatch::Reader batch,
                                      Clock::time_point now);
  // See Aggregator::progress: `moved` tells whether anything did; an error fails the job.
  struct Progress {
    bool moved = false;
    std::optional<std::string> error;
  };
  Progress progress(Clock::time_point now, std::chrono::seconds timeout);
  bool busy() const { return !batches_.empty(); }
  size_t collectives_in_flight() const { return batches_.size(); }

  // Totals for the metrics and gradsyncctl; chunk waits since the last call (seconds).
  uint64_t bytes_received() const { return bytes_received_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t chunks_summed() const { return chunks_summed_; }
  uint64_t pushes_waiting() const;
  std::vector<double> take_chunk_waits() { return std::move(chunk_waits_); }

 private:
  // One collective: this aggregator's chunks of it, every node's pushes of each side by side,
  // then their sum.
  struct Batch {
    uint32_t sequence = 0;
    gradsync_dtype dtype = GRADSYNC_FLOAT32;
    gradsync_op op = GRADSYNC_SUM;
    uint64_t count = 0;
    bool bf16 = false;
    size_t travelling = 0;          // bytes per element on the wire
    uint64_t chunks = 0;            // this aggregator's
    std::vector<uint64_t> offsets;  // by chunk, its bytes' place in a node's share; one more
    std::vector<bool> announced;    // by node
    // Pushes land in `arrivals`, node after node, each a share of offsets.back() bytes; sums
    // are written to `sums`. Shared: a job dropped mid-collective hands them to the transport.
    std::shared_ptr<std::vector<uint8_t>> arrivals;
    std::shared_ptr<std::vector<uint8_t>> sums;
    std::vector<transport::Operation> pushes;   // [node * chunks + chunk]
    std::vector<bool> pushed;                   // the same: arrived and checked
    std::vector<uint32_t> arrived;              // by chunk: pushes in
    std::vector<Clock::time_point> first_push;  // by chunk
    std::vector<uint32_t> sent;                 // by chunk: nodes its sum went to
    std::vector<transport::Operation> sends;    // sums out
    uint64_t chunks_summed = 0;
    Clock::time_point last_moved;  // a push arrived, or it was announced
  };
  std::optional<std::string> start(Batch& batch, uint32_t node);
  void sum(Batch& batch, uint64_t chunk);
  // Sends the chunk's sum to every node not sent to yet that has accepted this aggregator.
  void send_sum(Batch& batch, uint64_t chunk);
  std::shared_ptr<std::vector<uint8_t>> buffer(size_t bytes);
  void release(Batch& batch);

  Shape shape_;
  transport::Transport& transport_;
  std::vector<uint64_t> incarnations_;
  std::map<uint32_t, Batch> batches_;  // by sequence
  // Buffers of ended collectives, for the next ones: a fresh one costs a page fault per page.
  std::vector<std::shared_ptr<std::vector<uint8_t>>> spare_;
  std::vector<float> decoded_;  // the bf16 codec's: one chunk of f32, twice
  uint64_t bytes_received_ = 0;
  uint64_t bytes_sent_ = 0;
  uint64_t chunks_summed_ = 0;
  std::vector<double> chunk_waits_;
};

}  // namespace gradsync::daemon
