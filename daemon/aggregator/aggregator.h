// The aggregator role (`gradsyncd --role aggregator`, docs/aggregators.md): a daemon with no
// ranks of its own that sums allreduces for other nodes' jobs, the summation service of PHub
// and BytePS. A job's node daemons join it once the job has formed across them, announce each
// collective they push through it, and push its chunks; the aggregator sums each chunk over
// every node as soon as the last push of it is in and sends the sum back to every node, so
// chunks stream through. It serves any number of jobs; a job's fault (a node that fails or
// leaves, a push that does not fit what was announced, pushes that do not come) drops that job
// alone, with an error to each of its nodes, and frees its memory.
// Engine-thread only.
#pragma once

#include "daemon/aggregator/aggregator_job.h"
#include "metrics/metrics.h"
#include "transport/transport.h"

#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gradsync::daemon {

struct AggregatorSettings {
  std::string address;  // this aggregator's inter-node address, in its errors to nodes
  // A collective whose pushes stop coming for this long fails its job (a node that stopped
  // without its connection breaking).
  std::chrono::seconds peer_timeout{60};
};

// A job as gradsyncctl shows it.
struct AggregatorJobView {
  std::string name;
  std::vector<std::string> nodes;
  uint32_t index = 0;  // this aggregator's place among the job's
  uint32_t aggregators = 0;
  uint64_t chunk_bytes = 0;
  size_t collectives_in_flight = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t chunks_summed = 0;
};

class Aggregator {
 public:
  Aggregator(transport::Transport& transport, metrics::Metrics& metrics,
             AggregatorSettings settings);
  ~Aggregator();
  Aggregator(const Aggregator&) = delete;
  Aggregator& operator=(const Aggregator&) = delete;

  // A message under tag kind tags::kAggregation from a node daemon (aggregation.capnp).
  void on_message(std::span<const uint8_t> payload, uint64_t tag);
  // Sums the chunks whose pushes are in, sends what can go, ends collectives whose sums are
  // out, and fails jobs whose pushes stopped. True when anything moved.
  bool progress(std::chrono::steady_clock::time_point now);
  // A peer failed: the jobs it was a node of fail, their other nodes told.
  void on_peer_failed(transport::PeerId peer, const std::string& why);
  // Collectives in flight: the engine polls rather than sleeps.
  bool busy() const;
  // Pushes that arrived with no receive posted for them (their tags), dropped by the engine:
  // a job served here whose node pushed what it did not announce fails; pushes of jobs not
  // served (dropped while their pushes were on the way) are counted and logged.
  void on_unexpected_pushes(const std::vector<uint64_t>& push_tags);
  std::vector<AggregatorJobView> jobs() const;
  // Exports each job's figures (once a second).
  void export_metrics();

 private:
  void on_join(std::string_view job, uint32_t node, uint64_t incarnation,
               wire::AggregationJoin::Reader join);
  // Drops the job: its collectives' operations retire with their memory, and unless `error`
  // is empty, each of its nodes that is still there gets it.
  void drop(const std::string& name, const std::string& error);
  // An error to the node at `address` for a job this aggregator does not serve.
  void refuse(const std::string& address, std::string_view job, uint64_t incarnation,
              const std::string& error);

  transport::Transport& transport_;
  metrics::Metrics& metrics_;
  AggregatorSettings settings_;
  std::shared_ptr<spdlog::logger> log_;
  std::map<std::string, std::unique_ptr<AggregatorJob>, std::less<>> jobs_;
};

}  // namespace gradsync::daemon
