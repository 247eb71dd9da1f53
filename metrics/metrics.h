// The daemon's Prometheus metrics. Other parts record through this interface; only this folder
// includes prometheus-cpp. Label sets are bounded: no tensor names, no per-step labels.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gradsync::metrics {

enum class CollectiveKind { kAllreduce, kBroadcast, kAllgather, kBarrier, kCount };

struct BuildInfo {
  std::string version;
  bool cuda = false;
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
  // The effective configuration (gradsync_config_info) after a reload.
  void set_config_info(const std::string& config_toml);

  void set_connected_clients(int64_t clients);
  void set_jobs(int64_t jobs);
  void collective_completed(CollectiveKind kind, uint64_t bytes);  // on one node ("local")
  // Across nodes; `algorithm` is one of a fixed few (see the metric's help).
  void collective_completed(CollectiveKind kind, uint64_t bytes, const char* algorithm);
  void collective_failed(CollectiveKind kind);
  void batch_executed(uint64_t bytes, uint64_t collectives, double seconds);
  void client_rejected(const std::string& reason);  // reason: a fixed, small set

  // Across nodes. `peer`: a peer daemon's inter-node address (bounded by the cluster's size).
  void peer_link_measured(const std::string& peer, double latency_seconds, double bytes_per_second);
  // Per job (jobs are few and end: their series go with them).
  void set_stall(const std::string& job, double seconds);
  void job_ended(const std::string& job);
  void negotiated(uint64_t cache_hits, uint64_t cache_misses, uint64_t cycles);  // increments
  void internode_allreduce(const char* algorithm);                               // "ring" or "rhd"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradsync::metrics
