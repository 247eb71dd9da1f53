// The daemon's Prometheus metrics. Other parts record through this interface; only this folder
// includes prometheus-cpp. Label sets are bounded: no tensor names, no per-step labels.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::metrics {

enum class CollectiveKind {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kBarrier,
  kReduceScatter,
  kAllToAll,
  kCount
};

struct BuildInfo {
  std::string version;
  bool cuda = false;       // built with CUDA
  size_t devices = 0;      // GPUs whose memory the daemon serves (0: host memory only)
  size_t mps_devices = 0;  // of those, the ones shared through NVIDIA MPS
  std::string reduce_isa;
};

class Metrics {
 public:
  // Serves /metrics on `listen` (HOST:PORT; port 0 picks one); empty `listen` serves nothing
  // but still records. Throws std::runtime_error when the address cannot be bound.
  Metrics(const std::string& listen, const BuildInfo& build, const std::string& config_toml);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  std::vector<uint16_t> listening_ports() const;
  // What /metrics serves now, in Prometheus' text format.
  std::string exposition() const;
  // The effective configuration (gradsync_config_info) after a reload.
  void set_config_info(const std::string& config_toml);

  void set_connected_clients(int64_t clients);
  void set_link_pacer_rate(double bytes_per_second);
  // Jobs with a rank on this node, by state.
  void set_jobs(int64_t forming, int64_t running, int64_t failed);
  // One collective done (once per tensor, not per rank). `algorithm`: "local" on one node;
  // across nodes one of a fixed few (see the metric's help). `seconds`: from ready on this
  // node (every local rank submitted it) to done. Tallied here, and published to the series
  // by flush_completions: both from one thread (the engine's).
  void collective_completed(CollectiveKind kind, uint64_t bytes, const char* algorithm,
                            double seconds);
  void flush_completions();
  void collective_failed(CollectiveKind kind);
  // `fusion_use`: the batch's bytes over the fusion threshold.
  void batch_executed(uint64_t bytes, uint64_t collectives, double seconds, double fusion_use);
  // Entries the engine took from one client's submission ring in one go: how deep it was.
  void ring_drained(uint64_t entries);
  // The mapping caches of registered client memory. Memory is mapped when registered (a miss);
  // a submission's buffer is then a hit, a miss if it was evicted and mapped again, or names
  // nothing registered.
  enum class MappingLookup { kHit, kMiss, kUnregistered };
  void mapping_lookups(MappingLookup result, uint64_t count);
  // Mappings dropped because their client unregistered them or left (unmapped once no
  // collective in flight uses them).
  void mappings_released(uint64_t buffers);
  // Registered buffers mapped now, over every client (sampled).
  void set_mappings(uint64_t buffers, uint64_t bytes);
  void client_rejected(const std::string& reason);  // reason: a fixed, small set

  // Across nodes. A cluster handshake ended (no peer label: a refused peer names itself).
  void peer_handshake(bool accepted);
  // `peer`: a peer daemon's inter-node address (bounded by the cluster's size).
  void peer_link_measured(const std::string& peer, double latency_seconds, double bytes_per_second);
  // Totals so far; the counters move by the difference from the last call.
  void set_peer_traffic(const std::string& peer, uint64_t bytes_sent, uint64_t bytes_received,
                        uint64_t errors);
  // What one node's negotiation did since the last report (increments).
  struct Negotiated {
    uint64_t cache_hits = 0;
    uint64_t cache_misses = 0;
    uint64_t cycles = 0;
    uint64_t cycle_messages = 0;  // parts of cycles sent to other nodes, direct or relayed
  };
  void negotiated(const Negotiated& since_last);
  // "ring", "rhd", "direct", "aggregate", "split", "topk" or "negotiation"
  void internode_allreduce(const char* algorithm);
  // The top-k codec's held-back values, all jobs together: what a job's holding changed by,
  // and tensor names it dropped past its bound (increments).
  void topk_held(int64_t bytes_delta, uint64_t evicted_tensors);

  // Per job (jobs are few and end: their series go with them), sampled.
  struct JobProgress {
    double stall_seconds = 0;
    double step_bus_bandwidth = 0;         // bytes per second, of the last whole step (0: none yet)
    std::vector<uint64_t> rank_submitted;  // by local rank: collectives taken from its ring
    std::vector<uint64_t> rank_completed;  // completions posted to it
    std::vector<uint64_t> node_cycles;     // by node: the last negotiation cycle heard from it
    // Its share of the node (docs/qos.md); the totals only grow.
    double weight = 1;
    double cap_bytes_per_second = 0;
    uint64_t engine_bytes = 0;
    uint64_t wire_bytes = 0;
    double wire_share = 0;
    double share_wait_seconds = 0;
    uint64_t scratch_bytes = 0;  // its collectives across nodes hold (NodeJob::scratch_bytes)
    // Where this node tunes the job (docs/autotune.md).
    struct Autotune {
      uint64_t trials = 0;
      bool done = false;
      double best_bus_bandwidth = 0;  // bytes per second
      uint64_t fusion_threshold_bytes = 0;
      uint64_t piece_bytes = 0;
      double negotiation_hold_seconds = 0;
      uint64_t ring_min_bytes = 0;
    };
    std::optional<Autotune> autotune;
  };
  void set_job_progress(const std::string& job, const JobProgress& progress);
  void job_ended(const std::string& job);

  // On an aggregator (docs/aggregators.md), per job it serves: totals so far (the counters
  // move by the difference from the last call) and the pushes it waits for now, sampled; a
  // chunk's wait from its first push to its last, as each is summed.
  struct AggregatorJob {
    uint64_t bytes_received = 0;
    uint64_t bytes_sent = 0;
    uint64_t chunks_summed = 0;
    uint64_t pushes_waiting = 0;
  };
  void set_aggregator_job(const std::string& job, const AggregatorJob& totals);
  void aggregator_chunk_waited(const std::string& job, double seconds);
  void aggregator_job_ended(const std::string& job);
  // On a node: what its jobs pushed to an aggregator and received from it (increments).
  void aggregation_traffic(const std::string& aggregator, uint64_t bytes_sent,
                           uint64_t bytes_received);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradsync::metrics
