#include "metrics/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>

namespace gradsync::metrics {

namespace {
constexpr std::array<const char*, static_cast<size_t>(CollectiveKind::kCount)> kKindNames = {
    "allreduce", "broadcast", "allgather", "barrier"};

prometheus::Histogram::BucketBoundaries exponential(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double v = start; count-- > 0; v *= factor) bounds.push_back(v);
  return bounds;
}
}  // namespace

struct Metrics::Impl {
  // The exposer keeps only a weak pointer to the registry: we own it.
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  prometheus::Gauge* clients = nullptr;
  prometheus::Gauge* jobs = nullptr;
  std::array<prometheus::Counter*, kKindNames.size()> completed{};
  prometheus::Family<prometheus::Counter>* completed_family = nullptr;
  std::array<prometheus::Counter*, kKindNames.size()> failed{};
  std::array<prometheus::Counter*, kKindNames.size()> bytes{};
  prometheus::Histogram* batch_bytes = nullptr;
  prometheus::Histogram* batch_collectives = nullptr;
  prometheus::Histogram* batch_seconds = nullptr;
  prometheus::Family<prometheus::Counter>* rejected = nullptr;
  prometheus::Family<prometheus::Gauge>* peer_latency = nullptr;
  prometheus::Family<prometheus::Gauge>* stall = nullptr;
  prometheus::Family<prometheus::Gauge>* peer_bandwidth = nullptr;
  prometheus::Counter* cache_hits = nullptr;
  prometheus::Counter* cache_misses = nullptr;
  prometheus::Counter* cycles = nullptr;
  prometheus::Family<prometheus::Counter>* internode_allreduces = nullptr;
  prometheus::Family<prometheus::Gauge>* config_info = nullptr;
  prometheus::Gauge* config_now = nullptr;
};

Metrics::Metrics(const std::string& listen, const BuildInfo& build, const std::string& config_toml)
    : impl_(std::make_unique<Impl>()) {
  auto& registry = *impl_->registry;
  // Info metrics the Prometheus way: a gauge fixed at 1 whose labels carry the information.
  prometheus::BuildGauge()
      .Name("gradsync_build_info")
      .Help("Build of this gradsyncd")
      .Register(registry)
      .Add({{"version", build.version},
            {"cuda", build.cuda ? "on" : "off"},
            {"reduce_isa", build.reduce_isa}})
      .Set(1);
  impl_->config_info = &prometheus::BuildGauge()
                            .Name("gradsync_config_info")
                            .Help("Effective configuration of this gradsyncd, as TOML")
                            .Register(registry);
  set_config_info(config_toml);
  impl_->clients = &prometheus::BuildGauge()
                        .Name("gradsync_connected_clients")
                        .Help("Client processes connected to this daemon")
                        .Register(registry)
                        .Add({});
  impl_->jobs = &prometheus::BuildGauge()
                     .Name("gradsync_jobs")
                     .Help("Jobs with at least one connected rank on this node")
                     .Register(registry)
                     .Add({});
  auto& completed =
      prometheus::BuildCounter()
          .Name("gradsync_collectives_completed_total")
          .Help(
              "Collectives completed on this node (one per tensor, not per rank), by op and "
              "algorithm: local (one node), ring or rhd (allreduce across nodes), negotiation "
              "(data carried by the negotiation), direct (broadcast and allgather across nodes)")
          .Register(registry);
  impl_->completed_family = &completed;
  auto& failed = prometheus::BuildCounter()
                     .Name("gradsync_collectives_failed_total")
                     .Help("Collective submissions completed with an error (per rank)")
                     .Register(registry);
  auto& bytes = prometheus::BuildCounter()
                    .Name("gradsync_collective_bytes_total")
                    .Help("Payload bytes per rank of completed collectives")
                    .Register(registry);
  for (size_t i = 0; i < kKindNames.size(); ++i) {
    impl_->completed[i] = &completed.Add({{"op", kKindNames[i]}, {"algorithm", "local"}});
    impl_->failed[i] = &failed.Add({{"op", kKindNames[i]}});
    impl_->bytes[i] = &bytes.Add({{"op", kKindNames[i]}});
  }
  impl_->batch_bytes = &prometheus::BuildHistogram()
                            .Name("gradsync_fusion_batch_bytes")
                            .Help("Payload bytes per rank of each fused batch")
                            .Register(registry)
                            .Add({}, exponential(1024, 4, 12));
  impl_->batch_collectives = &prometheus::BuildHistogram()
                                  .Name("gradsync_fusion_batch_tensors")
                                  .Help("Tensors fused into each batch")
                                  .Register(registry)
                                  .Add({}, exponential(1, 2, 10));
  impl_->batch_seconds = &prometheus::BuildHistogram()
                              .Name("gradsync_batch_duration_seconds")
                              .Help("Time to execute one fused batch on the node")
                              .Register(registry)
                              .Add({}, exponential(1e-6, 4, 12));
  impl_->rejected = &prometheus::BuildCounter()
                         .Name("gradsync_client_requests_rejected_total")
                         .Help("Control requests refused, by reason")
                         .Register(registry);
  // Every series of a fixed label set exists from the start, at zero: rate() over it then
  // has data before the first event, as dashboards and alerts expect.
  for (const char* reason : {"too_many_clients", "protocol", "permission", "invalid"}) {
    impl_->rejected->Add({{"reason", reason}});
  }
  impl_->stall = &prometheus::BuildGauge()
                      .Name("gradsync_stall_seconds")
                      .Help(
                          "Age of the oldest tensor of a job that some of its ranks or nodes "
                          "have submitted and others have not (0: none)")
                      .Register(registry);
  impl_->peer_latency = &prometheus::BuildGauge()
                             .Name("gradsync_peer_latency_seconds")
                             .Help(
                                 "Per-message latency (alpha) to a peer node daemon, as measured "
                                 "when a job formed")
                             .Register(registry);
  impl_->peer_bandwidth = &prometheus::BuildGauge()
                               .Name("gradsync_peer_bandwidth_bytes_per_second")
                               .Help(
                                   "Bandwidth (1/beta) to a peer node daemon, as measured when a "
                                   "job formed")
                               .Register(registry);
  auto& cache = prometheus::BuildCounter()
                    .Name("gradsync_negotiation_cache_total")
                    .Help(
                        "Collectives negotiated across nodes, by whether the response cache "
                        "decided them (hit) or node 0 did (miss)")
                    .Register(registry);
  impl_->cache_hits = &cache.Add({{"result", "hit"}});
  impl_->cache_misses = &cache.Add({{"result", "miss"}});
  impl_->cycles = &prometheus::BuildCounter()
                       .Name("gradsync_negotiation_cycles_total")
                       .Help("Negotiation cycles among node daemons")
                       .Register(registry)
                       .Add({});
  impl_->internode_allreduces = &prometheus::BuildCounter()
                                     .Name("gradsync_internode_allreduces_total")
                                     .Help("Allreduces run across nodes, by algorithm")
                                     .Register(registry);
  for (const char* algorithm : {"ring", "rhd"})
    impl_->internode_allreduces->Add({{"algorithm", algorithm}});
  if (!listen.empty()) {
    impl_->exposer = std::make_unique<prometheus::Exposer>(listen, 2);
    impl_->exposer->RegisterCollectable(impl_->registry);
  }
}

Metrics::~Metrics() = default;

std::vector<uint16_t> Metrics::listening_ports() const {
  if (!impl_->exposer) return {};
  std::vector<uint16_t> ports;
  for (int port : impl_->exposer->GetListeningPorts()) ports.push_back(static_cast<uint16_t>(port));
  return ports;
}

void Metrics::set_config_info(const std::string& config_toml) {
  if (impl_->config_now != nullptr) impl_->config_info->Remove(impl_->config_now);
  impl_->config_now = &impl_->config_info->Add({{"toml", config_toml}});
  impl_->config_now->Set(1);
}

void Metrics::set_connected_clients(int64_t clients) {
  impl_->clients->Set(static_cast<double>(clients));
}
void Metrics::set_jobs(int64_t jobs) {
  impl_->jobs->Set(static_cast<double>(jobs));
}

void Metrics::collective_completed(CollectiveKind kind, uint64_t bytes) {
  impl_->completed[static_cast<size_t>(kind)]->Increment();
  impl_->bytes[static_cast<size_t>(kind)]->Increment(static_cast<double>(bytes));
}

void Metrics::collective_completed(CollectiveKind kind, uint64_t bytes, const char* algorithm) {
  impl_->completed_family
      ->Add({{"op", kKindNames[static_cast<size_t>(kind)]}, {"algorithm", algorithm}})
      .Increment();
  impl_->bytes[static_cast<size_t>(kind)]->Increment(static_cast<double>(bytes));
}

void Metrics::collective_failed(CollectiveKind kind) {
  impl_->failed[static_cast<size_t>(kind)]->Increment();
}

void Metrics::batch_executed(uint64_t bytes, uint64_t collectives, double seconds) {
  impl_->batch_bytes->Observe(static_cast<double>(bytes));
  impl_->batch_collectives->Observe(static_cast<double>(collectives));
  impl_->batch_seconds->Observe(seconds);
}

void Metrics::client_rejected(const std::string& reason) {  // one of those created above
  impl_->rejected->Add({{"reason", reason}}).Increment();
}

void Metrics::peer_link_measured(const std::string& peer, double latency_seconds,
                                 double bytes_per_second) {
  impl_->peer_latency->Add({{"peer", peer}}).Set(latency_seconds);
  impl_->peer_bandwidth->Add({{"peer", peer}}).Set(bytes_per_second);
}

void Metrics::set_stall(const std::string& job, double seconds) {
  impl_->stall->Add({{"job", job}}).Set(seconds);
}

void Metrics::job_ended(const std::string& job) {
  auto& stall = impl_->stall->Add({{"job", job}});
  impl_->stall->Remove(&stall);
}

void Metrics::negotiated(uint64_t cache_hits, uint64_t cache_misses, uint64_t cycles) {
  impl_->cache_hits->Increment(static_cast<double>(cache_hits));
  impl_->cache_misses->Increment(static_cast<double>(cache_misses));
  impl_->cycles->Increment(static_cast<double>(cycles));
}

void Metrics::internode_allreduce(const char* algorithm) {
  impl_->internode_allreduces->Add({{"algorithm", algorithm}}).Increment();
}

}  // namespace gradsync::metrics
