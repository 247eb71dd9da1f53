#include "metrics/metrics.h"

#include "metrics/families.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <stdexcept>
#include <type_traits>

namespace gradsync::metrics {

namespace {
constexpr std::array<const char*, static_cast<size_t>(CollectiveKind::kCount)> kKindNames = {
    "allreduce", "broadcast", "allgather", "barrier", "reduce_scatter", "alltoall"};
// How a collective ran: on one node, or across nodes by one of the rest.
constexpr std::array<const char*, 9> kAlgorithms = {
    "local", "ring", "rhd", "negotiation", "direct", "topk", "chain", "aggregate", "split"};
// Collective sizes (payload bytes per rank) the duration histogram keeps apart.
constexpr size_t kAutotuneFamilies =
    static_cast<size_t>(Family::kCount) - static_cast<size_t>(Family::kAutotuneTrials);
constexpr std::array<uint64_t, 4> kSizeBounds = {4ull << 10, 64ull << 10, 1ull << 20, 16ull << 20};
constexpr std::array<const char*, kSizeBounds.size() + 1> kSizeNames = {
    "<=4KiB", "<=64KiB", "<=1MiB", "<=16MiB", ">16MiB"};

size_t algorithm_index(const char* algorithm) {
  // Callers pass these very literals (the linker merges equal ones): compare pointers first,
  // since this runs for every collective completed.
  for (size_t i = 0; i < kAlgorithms.size(); ++i) {
    if (kAlgorithms[i] == algorithm) return i;
  }
  for (size_t i = 0; i < kAlgorithms.size(); ++i) {
    if (std::strcmp(kAlgorithms[i], algorithm) == 0) return i;
  }
  return 0;
}

size_t size_index(uint64_t bytes) {
  size_t i = 0;
  while (i < kSizeBounds.size() && bytes > kSizeBounds[i]) ++i;
  return i;
}

prometheus::Histogram::BucketBoundaries exponential(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double v = start; count-- > 0; v *= factor) bounds.push_back(v);
  return bounds;
}
template <typename Metric>
constexpr Type type_of() {
  if constexpr (std::is_same_v<Metric, prometheus::Counter>) return Type::kCounter;
  if constexpr (std::is_same_v<Metric, prometheus::Gauge>) return Type::kGauge;
  return Type::kHistogram;
}

// A family registered as the table (families.h) describes it.
template <typename Metric>
prometheus::Family<Metric>& family(prometheus::Registry& registry, Family id) {
  const FamilyDoc& doc = family_doc(id);
  if (doc.type != type_of<Metric>()) {
    throw std::logic_error(std::string(doc.name) + " registered as another type than families.h's");
  }
  if constexpr (type_of<Metric>() == Type::kCounter) {
    return prometheus::BuildCounter().Name(doc.name).Help(doc.help).Register(registry);
  } else if constexpr (type_of<Metric>() == Type::kGauge) {
    return prometheus::BuildGauge().Name(doc.name).Help(doc.help).Register(registry);
  } else {
    return prometheus::BuildHistogram().Name(doc.name).Help(doc.help).Register(registry);
  }
}
}  // namespace

struct Metrics::Impl {
  // The exposer keeps only a weak pointer to the registry: we own it.
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  prometheus::Gauge* clients = nullptr;
  prometheus::Gauge* link_pacer_rate = nullptr;
  std::array<prometheus::Gauge*, 3> jobs{};  // forming, running, failed
  // By op, then algorithm: made up front, so that counting one costs no label lookup.
  std::array<std::array<prometheus::Counter*, kAlgorithms.size()>, kKindNames.size()> completed{};
  std::array<std::array<prometheus::Histogram*, kSizeNames.size()>, kKindNames.size()> duration{};
  std::array<prometheus::Counter*, kKindNames.size()> failed{};
  std::array<prometheus::Counter*, kKindNames.size()> bytes{};
  prometheus::Histogram::BucketBoundaries duration_bounds = exponential(1e-6, 4, 12);
  // What collective_completed recorded since the last flush_completions. The shared series
  // cost atomic updates and, for a histogram, a lock each: per tensor, with a hundred small
  // tensors a step, that was a tenth of the engine's work on them.
  struct Tally {
    std::array<std::array<uint64_t, kAlgorithms.size()>, kKindNames.size()> completed{};
    std::array<uint64_t, kKindNames.size()> bytes{};
    struct Durations {
      std::vector<double> bucket_increments;  // by bucket, the last one +Inf
      double sum = 0;
      bool any = false;
    };
    std::array<std::array<Durations, kSizeNames.size()>, kKindNames.size()> durations;
    bool any = false;
  } tally;
  std::array<prometheus::Counter*, kAlgorithms.size()> internode_allreduce_by{};
  prometheus::Histogram* batch_bytes = nullptr;
  prometheus::Histogram* batch_collectives = nullptr;
  prometheus::Histogram* batch_seconds = nullptr;
  prometheus::Histogram* fusion_use = nullptr;
  prometheus::Histogram* ring_depth = nullptr;
  std::array<prometheus::Counter*, 3> mapping_lookups{};  // hit, miss, unregistered
  prometheus::Counter* mappings_released = nullptr;
  prometheus::Gauge* mapped_buffers = nullptr;
  prometheus::Gauge* mapped_bytes = nullptr;
  prometheus::Gauge* topk_held_bytes = nullptr;
  prometheus::Counter* topk_evicted = nullptr;
  prometheus::Family<prometheus::Counter>* rejected = nullptr;
  prometheus::Counter* handshakes_accepted = nullptr;
  prometheus::Counter* handshakes_refused = nullptr;
  prometheus::Family<prometheus::Gauge>* peer_latency = nullptr;
  prometheus::Family<prometheus::Gauge>* stall = nullptr;
  prometheus::Family<prometheus::Gauge>* peer_bandwidth = nullptr;
  prometheus::Family<prometheus::Counter>* peer_sent = nullptr;
  prometheus::Family<prometheus::Counter>* peer_received = nullptr;
  prometheus::Family<prometheus::Counter>* peer_errors = nullptr;
  struct PeerTotals {
    uint64_t sent = 0;
    uint64_t received = 0;
    uint64_t errors = 0;
  };
  std::map<std::string, PeerTotals> peer_totals;  // as last reported: counters move by deltas
  prometheus::Family<prometheus::Gauge>* step_bus_bandwidth = nullptr;
  prometheus::Family<prometheus::Gauge>* rank_submitted = nullptr;
  prometheus::Family<prometheus::Gauge>* rank_completed = nullptr;
  prometheus::Family<prometheus::Gauge>* node_cycle = nullptr;
  prometheus::Family<prometheus::Gauge>* job_weight = nullptr;
  prometheus::Family<prometheus::Gauge>* job_cap = nullptr;
  prometheus::Family<prometheus::Counter>* job_engine_bytes = nullptr;
  prometheus::Family<prometheus::Counter>* job_wire_bytes = nullptr;
  prometheus::Family<prometheus::Gauge>* job_wire_share = nullptr;
  prometheus::Family<prometheus::Counter>* job_share_wait = nullptr;
  prometheus::Family<prometheus::Gauge>* job_scratch = nullptr;
  // The autotune families, in Family's order from kAutotuneTrials.
  std::array<prometheus::Family<prometheus::Gauge>*, kAutotuneFamilies> autotune{};
  prometheus::Family<prometheus::Counter>* aggregator_received = nullptr;
  prometheus::Family<prometheus::Counter>* aggregator_sent = nullptr;
  prometheus::Family<prometheus::Counter>* aggregator_summed = nullptr;
  prometheus::Family<prometheus::Histogram>* aggregator_wait = nullptr;
  prometheus::Family<prometheus::Gauge>* aggregator_waiting = nullptr;
  prometheus::Family<prometheus::Counter>* aggregation_sent = nullptr;
  prometheus::Family<prometheus::Counter>* aggregation_received = nullptr;
  struct AggregatorSeries {
    prometheus::Counter* received = nullptr;
    prometheus::Counter* sent = nullptr;
    prometheus::Counter* summed = nullptr;
    prometheus::Histogram* wait = nullptr;
    prometheus::Gauge* waiting = nullptr;
    AggregatorJob last;
  };
  std::map<std::string, AggregatorSeries> aggregator_series;
  AggregatorSeries& aggregator_job(const std::string& job) {
    AggregatorSeries& series = aggregator_series[job];
    if (series.received == nullptr) {
      const prometheus::Labels labels{{"training_job", job}};
      series.received = &aggregator_received->Add(labels);
      series.sent = &aggregator_sent->Add(labels);
      series.summed = &aggregator_summed->Add(labels);
      series.wait = &aggregator_wait->Add(labels, exponential(1e-5, 4, 10));
      series.waiting = &aggregator_waiting->Add(labels);
    }
    return series;
  }
  // Each job's series, removed when it ends.
  struct JobSeries {
    prometheus::Gauge* stall = nullptr;
    prometheus::Gauge* step_bus_bandwidth = nullptr;
    std::vector<prometheus::Gauge*> rank_submitted;
    std::vector<prometheus::Gauge*> rank_completed;
    std::vector<prometheus::Gauge*> node_cycle;
    prometheus::Gauge* weight = nullptr;
    prometheus::Gauge* cap = nullptr;
    prometheus::Counter* engine_bytes = nullptr;
    prometheus::Counter* wire_bytes = nullptr;
    prometheus::Gauge* wire_share = nullptr;
    prometheus::Counter* share_wait = nullptr;
    prometheus::Gauge* scratch = nullptr;
    std::array<prometheus::Gauge*, kAutotuneFamilies> autotune{};  // once the job tunes here
    JobProgress last;  // as last reported: the counters move by its differences
  };
  std::map<std::string, JobSeries> job_series;
  prometheus::Counter* cache_hits = nullptr;
  prometheus::Counter* cache_misses = nullptr;
  prometheus::Counter* cycles = nullptr;
  prometheus::Counter* cycle_messages = nullptr;
  prometheus::Family<prometheus::Counter>* internode_allreduces = nullptr;
  prometheus::Family<prometheus::Gauge>* config_info = nullptr;
  prometheus::Gauge* config_now = nullptr;
};

Metrics::Metrics(const std::string& listen, const BuildInfo& build, const std::string& config_toml)
    : impl_(std::make_unique<Impl>()) {
  auto& registry = *impl_->registry;
  // Info metrics the Prometheus way: a gauge fixed at 1 whose labels carry the information.
  family<prometheus::Gauge>(registry, Family::kBuildInfo)
      .Add({{"version", build.version},
            {"cuda", build.cuda ? "on" : "off"},
            {"devices", std::to_string(build.devices)},
            {"mps_devices", std::to_string(build.mps_devices)},
            {"reduce_isa", build.reduce_isa}})
      .Set(1);
  impl_->config_info = &family<prometheus::Gauge>(registry, Family::kConfigInfo);
  set_config_info(config_toml);
  impl_->clients = &family<prometheus::Gauge>(registry, Family::kConnectedClients).Add({});
  impl_->link_pacer_rate =
      &family<prometheus::Gauge>(registry, Family::kLinkPacerRateBytesPerSecond).Add({});
  auto& jobs = family<prometheus::Gauge>(registry, Family::kJobs);
  impl_->jobs = {&jobs.Add({{"state", "forming"}}), &jobs.Add({{"state", "running"}}),
                 &jobs.Add({{"state", "failed"}})};
  auto& completed = family<prometheus::Counter>(registry, Family::kCollectivesCompleted);
  auto& duration = family<prometheus::Histogram>(registry, Family::kCollectiveDurationSeconds);
  auto& failed = family<prometheus::Counter>(registry, Family::kCollectivesFailed);
  auto& bytes = family<prometheus::Counter>(registry, Family::kCollectiveBytes);
  for (size_t i = 0; i < kKindNames.size(); ++i) {
    for (size_t a = 0; a < kAlgorithms.size(); ++a) {
      impl_->completed[i][a] =
          &completed.Add({{"op", kKindNames[i]}, {"algorithm", kAlgorithms[a]}});
    }
    for (size_t z = 0; z < kSizeNames.size(); ++z) {
      impl_->duration[i][z] =
          &duration.Add({{"op", kKindNames[i]}, {"size", kSizeNames[z]}}, impl_->duration_bounds);
      impl_->tally.durations[i][z].bucket_increments.assign(impl_->duration_bounds.size() + 1, 0);
    }
    impl_->failed[i] = &failed.Add({{"op", kKindNames[i]}});
    impl_->bytes[i] = &bytes.Add({{"op", kKindNames[i]}});
  }
  impl_->batch_bytes = &family<prometheus::Histogram>(registry, Family::kFusionBatchBytes)
                            .Add({}, exponential(1024, 4, 12));
  impl_->batch_collectives = &family<prometheus::Histogram>(registry, Family::kFusionBatchTensors)
                                  .Add({}, exponential(1, 2, 10));
  impl_->batch_seconds = &family<prometheus::Histogram>(registry, Family::kBatchDurationSeconds)
                              .Add({}, exponential(1e-6, 4, 12));
  impl_->fusion_use = &family<prometheus::Histogram>(registry, Family::kFusionBufferUseRatio)
                           .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25,
                                                                            0.5, 0.75, 0.9, 1.0});
  impl_->ring_depth = &family<prometheus::Histogram>(registry, Family::kSubmissionRingDepthEntries)
                           .Add({}, exponential(1, 4, 7));
  auto& lookups = family<prometheus::Counter>(registry, Family::kMappingCacheLookups);
  impl_->mapping_lookups = {&lookups.Add({{"result", "hit"}}), &lookups.Add({{"result", "miss"}}),
                            &lookups.Add({{"result", "unregistered"}})};
  impl_->mappings_released =
      &family<prometheus::Counter>(registry, Family::kMappingCacheReleased).Add({});
  impl_->mapped_buffers = &family<prometheus::Gauge>(registry, Family::kMappedBuffers).Add({});
  impl_->mapped_bytes = &family<prometheus::Gauge>(registry, Family::kMappedBytes).Add({});
  impl_->topk_held_bytes = &family<prometheus::Gauge>(registry, Family::kTopkHeldBytes).Add({});
  impl_->topk_evicted = &family<prometheus::Counter>(registry, Family::kTopkEvictedTensors).Add({});
  impl_->rejected = &family<prometheus::Counter>(registry, Family::kClientRequestsRejected);
  // Every series of a fixed label set exists from the start, at zero: rate() over it then
  // has data before the first event, as dashboards and alerts expect.
  for (const char* reason : {"too_many_clients", "protocol", "permission", "invalid"}) {
    impl_->rejected->Add({{"reason", reason}});
  }
  auto& handshakes = family<prometheus::Counter>(registry, Family::kPeerHandshakes);
  impl_->handshakes_accepted = &handshakes.Add({{"result", "accepted"}});
  impl_->handshakes_refused = &handshakes.Add({{"result", "refused"}});
  impl_->stall = &family<prometheus::Gauge>(registry, Family::kStallSeconds);
  impl_->peer_latency = &family<prometheus::Gauge>(registry, Family::kPeerLatencySeconds);
  impl_->peer_bandwidth =
      &family<prometheus::Gauge>(registry, Family::kPeerBandwidthBytesPerSecond);
  impl_->peer_sent = &family<prometheus::Counter>(registry, Family::kPeerSentBytes);
  impl_->peer_received = &family<prometheus::Counter>(registry, Family::kPeerReceivedBytes);
  impl_->peer_errors = &family<prometheus::Counter>(registry, Family::kPeerErrors);
  impl_->step_bus_bandwidth =
      &family<prometheus::Gauge>(registry, Family::kStepBusBandwidthBytesPerSecond);
  impl_->rank_submitted = &family<prometheus::Gauge>(registry, Family::kRankSubmittedSequence);
  impl_->rank_completed = &family<prometheus::Gauge>(registry, Family::kRankCompletedSequence);
  impl_->node_cycle = &family<prometheus::Gauge>(registry, Family::kNodeCycleSequence);
  impl_->job_weight = &family<prometheus::Gauge>(registry, Family::kJobWeight);
  impl_->job_cap = &family<prometheus::Gauge>(registry, Family::kJobCapBytesPerSecond);
  impl_->job_engine_bytes = &family<prometheus::Counter>(registry, Family::kJobEngineBytes);
  impl_->job_wire_bytes = &family<prometheus::Counter>(registry, Family::kJobWireBytes);
  impl_->job_wire_share = &family<prometheus::Gauge>(registry, Family::kJobWireShare);
  impl_->job_share_wait = &family<prometheus::Counter>(registry, Family::kJobShareWaitSeconds);
  impl_->job_scratch = &family<prometheus::Gauge>(registry, Family::kJobScratchBytes);
  impl_->aggregator_received =
      &family<prometheus::Counter>(registry, Family::kAggregatorBytesReceived);
  impl_->aggregator_sent = &family<prometheus::Counter>(registry, Family::kAggregatorBytesSent);
  impl_->aggregator_summed =
      &family<prometheus::Counter>(registry, Family::kAggregatorChunksSummed);
  impl_->aggregator_wait =
      &family<prometheus::Histogram>(registry, Family::kAggregatorChunkWaitSeconds);
  impl_->aggregator_waiting =
      &family<prometheus::Gauge>(registry, Family::kAggregatorPushesWaiting);
  impl_->aggregation_sent = &family<prometheus::Counter>(registry, Family::kAggregationSentBytes);
  impl_->aggregation_received =
      &family<prometheus::Counter>(registry, Family::kAggregationReceivedBytes);
  for (size_t i = 0; i < kAutotuneFamilies; ++i) {
    impl_->autotune[i] = &family<prometheus::Gauge>(
        registry, static_cast<Family>(static_cast<size_t>(Family::kAutotuneTrials) + i));
  }
  auto& cache = family<prometheus::Counter>(registry, Family::kNegotiationCache);
  impl_->cache_hits = &cache.Add({{"result", "hit"}});
  impl_->cache_misses = &cache.Add({{"result", "miss"}});
  impl_->cycles = &family<prometheus::Counter>(registry, Family::kNegotiationCycles).Add({});
  impl_->cycle_messages =
      &family<prometheus::Counter>(registry, Family::kNegotiationMessages).Add({});
  impl_->internode_allreduces =
      &family<prometheus::Counter>(registry, Family::kInternodeAllreduces);
  for (const char* algorithm : {"ring", "rhd", "topk"}) {
    impl_->internode_allreduce_by[algorithm_index(algorithm)] =
        &impl_->internode_allreduces->Add({{"algorithm", algorithm}});
  }
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

std::string Metrics::exposition() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

void Metrics::set_config_info(const std::string& config_toml) {
  if (impl_->config_now != nullptr) impl_->config_info->Remove(impl_->config_now);
  impl_->config_now = &impl_->config_info->Add({{"toml", config_toml}});
  impl_->config_now->Set(1);
}

void Metrics::set_connected_clients(int64_t clients) {
  impl_->clients->Set(static_cast<double>(clients));
}
void Metrics::set_link_pacer_rate(double bytes_per_second) {
  impl_->link_pacer_rate->Set(bytes_per_second);
}
void Metrics::set_jobs(int64_t forming, int64_t running, int64_t failed) {
  impl_->jobs[0]->Set(static_cast<double>(forming));
  impl_->jobs[1]->Set(static_cast<double>(running));
  impl_->jobs[2]->Set(static_cast<double>(failed));
}

void Metrics::collective_completed(CollectiveKind kind, uint64_t bytes, const char* algorithm,
                                   double seconds) {
  const auto k = static_cast<size_t>(kind);
  Impl::Tally& tally = impl_->tally;
  tally.any = true;
  ++tally.completed[k][algorithm_index(algorithm)];
  tally.bytes[k] += bytes;
  Impl::Tally::Durations& durations = tally.durations[k][size_index(bytes)];
  // The bucket Histogram::Observe would pick: the first bound not below the value.
  const auto& bounds = impl_->duration_bounds;
  const auto bucket = std::lower_bound(bounds.begin(), bounds.end(), seconds) - bounds.begin();
  durations.bucket_increments[static_cast<size_t>(bucket)] += 1;
  durations.sum += seconds;
  durations.any = true;
}

void Metrics::flush_completions() {
  Impl::Tally& tally = impl_->tally;
  if (!tally.any) return;
  tally.any = false;
  for (size_t k = 0; k < kKindNames.size(); ++k) {
    for (size_t a = 0; a < kAlgorithms.size(); ++a) {
      if (tally.completed[k][a] == 0) continue;
      impl_->completed[k][a]->Increment(static_cast<double>(tally.completed[k][a]));
      tally.completed[k][a] = 0;
    }
    if (tally.bytes[k] != 0) {
      impl_->bytes[k]->Increment(static_cast<double>(tally.bytes[k]));
      tally.bytes[k] = 0;
    }
    for (size_t z = 0; z < kSizeNames.size(); ++z) {
      Impl::Tally::Durations& durations = tally.durations[k][z];
      if (!durations.any) continue;
      impl_->duration[k][z]->ObserveMultiple(durations.bucket_increments, durations.sum);
      std::fill(durations.bucket_increments.begin(), durations.bucket_increments.end(), 0);
      durations.sum = 0;
      durations.any = false;
    }
  }
}

void Metrics::collective_failed(CollectiveKind kind) {
  impl_->failed[static_cast<size_t>(kind)]->Increment();
}

void Metrics::batch_executed(uint64_t bytes, uint64_t collectives, double seconds,
                             double fusion_use) {
  impl_->batch_bytes->Observe(static_cast<double>(bytes));
  impl_->batch_collectives->Observe(static_cast<double>(collectives));
  impl_->batch_seconds->Observe(seconds);
  impl_->fusion_use->Observe(fusion_use);
}

void Metrics::mapping_lookups(MappingLookup result, uint64_t count) {
  impl_->mapping_lookups[static_cast<size_t>(result)]->Increment(static_cast<double>(count));
}

void Metrics::mappings_released(uint64_t buffers) {
  impl_->mappings_released->Increment(static_cast<double>(buffers));
}

void Metrics::set_mappings(uint64_t buffers, uint64_t bytes) {
  impl_->mapped_buffers->Set(static_cast<double>(buffers));
  impl_->mapped_bytes->Set(static_cast<double>(bytes));
}

void Metrics::topk_held(int64_t bytes_delta, uint64_t evicted_tensors) {
  impl_->topk_held_bytes->Increment(static_cast<double>(bytes_delta));
  if (evicted_tensors > 0) impl_->topk_evicted->Increment(static_cast<double>(evicted_tensors));
}

void Metrics::ring_drained(uint64_t entries) {
  impl_->ring_depth->Observe(static_cast<double>(entries));
}

void Metrics::peer_handshake(bool accepted) {
  (accepted ? impl_->handshakes_accepted : impl_->handshakes_refused)->Increment();
}

void Metrics::client_rejected(const std::string& reason) {  // one of those created above
  impl_->rejected->Add({{"reason", reason}}).Increment();
}

void Metrics::peer_link_measured(const std::string& peer, double latency_seconds,
                                 double bytes_per_second) {
  impl_->peer_latency->Add({{"peer", peer}}).Set(latency_seconds);
  impl_->peer_bandwidth->Add({{"peer", peer}}).Set(bytes_per_second);
}

void Metrics::set_peer_traffic(const std::string& peer, uint64_t bytes_sent,
                               uint64_t bytes_received, uint64_t errors) {
  Impl::PeerTotals& last = impl_->peer_totals[peer];
  const prometheus::Labels labels{{"peer", peer}};
  impl_->peer_sent->Add(labels).Increment(static_cast<double>(bytes_sent - last.sent));
  impl_->peer_received->Add(labels).Increment(static_cast<double>(bytes_received - last.received));
  impl_->peer_errors->Add(labels).Increment(static_cast<double>(errors - last.errors));
  last = {bytes_sent, bytes_received, errors};
}

namespace {

// Gauges labelled {job, what=i} for i in [0, count), made as a job's ranks or nodes appear.
void grow(prometheus::Family<prometheus::Gauge>& family, std::vector<prometheus::Gauge*>& gauges,
          const std::string& job, const char* what, size_t count) {
  while (gauges.size() < count) {
    gauges.push_back(&family.Add({{"training_job", job}, {what, std::to_string(gauges.size())}}));
  }
}

}  // namespace

void Metrics::set_job_progress(const std::string& job, const JobProgress& progress) {
  Impl::JobSeries& series = impl_->job_series[job];
  if (series.stall == nullptr) {
    series.stall = &impl_->stall->Add({{"training_job", job}});
    series.step_bus_bandwidth = &impl_->step_bus_bandwidth->Add({{"training_job", job}});
    const prometheus::Labels labels{{"training_job", job}};
    series.weight = &impl_->job_weight->Add(labels);
    series.cap = &impl_->job_cap->Add(labels);
    series.engine_bytes = &impl_->job_engine_bytes->Add(labels);
    series.wire_bytes = &impl_->job_wire_bytes->Add(labels);
    series.wire_share = &impl_->job_wire_share->Add(labels);
    series.share_wait = &impl_->job_share_wait->Add(labels);
    series.scratch = &impl_->job_scratch->Add(labels);
  }
  series.weight->Set(progress.weight);
  series.cap->Set(progress.cap_bytes_per_second);
  series.wire_share->Set(progress.wire_share);
  series.scratch->Set(static_cast<double>(progress.scratch_bytes));
  series.engine_bytes->Increment(
      static_cast<double>(progress.engine_bytes - series.last.engine_bytes));
  series.wire_bytes->Increment(static_cast<double>(progress.wire_bytes - series.last.wire_bytes));
  series.share_wait->Increment(
      std::max(0.0, progress.share_wait_seconds - series.last.share_wait_seconds));
  series.last.engine_bytes = progress.engine_bytes;
  series.last.wire_bytes = progress.wire_bytes;
  series.last.share_wait_seconds = progress.share_wait_seconds;
  series.stall->Set(progress.stall_seconds);
  series.step_bus_bandwidth->Set(progress.step_bus_bandwidth);
  grow(*impl_->rank_submitted, series.rank_submitted, job, "local_rank",
       progress.rank_submitted.size());
  grow(*impl_->rank_completed, series.rank_completed, job, "local_rank",
       progress.rank_completed.size());
  grow(*impl_->node_cycle, series.node_cycle, job, "node", progress.node_cycles.size());
  for (size_t r = 0; r < progress.rank_submitted.size(); ++r) {
    series.rank_submitted[r]->Set(static_cast<double>(progress.rank_submitted[r]));
  }
  for (size_t r = 0; r < progress.rank_completed.size(); ++r) {
    series.rank_completed[r]->Set(static_cast<double>(progress.rank_completed[r]));
  }
  for (size_t n = 0; n < progress.node_cycles.size(); ++n) {
    series.node_cycle[n]->Set(static_cast<double>(progress.node_cycles[n]));
  }
  if (const auto& tune = progress.autotune) {
    if (series.autotune.front() == nullptr) {
      for (size_t i = 0; i < kAutotuneFamilies; ++i) {
        series.autotune[i] = &impl_->autotune[i]->Add({{"training_job", job}});
      }
    }
    const std::array<double, kAutotuneFamilies> values{
        static_cast<double>(tune->trials),
        tune->done ? 1.0 : 0.0,
        tune->best_bus_bandwidth,
        static_cast<double>(tune->fusion_threshold_bytes),
        static_cast<double>(tune->piece_bytes),
        tune->negotiation_hold_seconds,
        static_cast<double>(tune->ring_min_bytes)};
    for (size_t i = 0; i < kAutotuneFamilies; ++i) series.autotune[i]->Set(values[i]);
  }
}

void Metrics::job_ended(const std::string& job) {
  const auto it = impl_->job_series.find(job);
  if (it == impl_->job_series.end()) return;
  Impl::JobSeries& series = it->second;
  impl_->stall->Remove(series.stall);
  impl_->step_bus_bandwidth->Remove(series.step_bus_bandwidth);
  for (auto* gauge : series.rank_submitted) impl_->rank_submitted->Remove(gauge);
  for (auto* gauge : series.rank_completed) impl_->rank_completed->Remove(gauge);
  for (auto* gauge : series.node_cycle) impl_->node_cycle->Remove(gauge);
  impl_->job_weight->Remove(series.weight);
  impl_->job_cap->Remove(series.cap);
  impl_->job_engine_bytes->Remove(series.engine_bytes);
  impl_->job_wire_bytes->Remove(series.wire_bytes);
  impl_->job_wire_share->Remove(series.wire_share);
  impl_->job_share_wait->Remove(series.share_wait);
  impl_->job_scratch->Remove(series.scratch);
  for (size_t i = 0; i < kAutotuneFamilies; ++i) {
    if (series.autotune[i] != nullptr) impl_->autotune[i]->Remove(series.autotune[i]);
  }
  impl_->job_series.erase(it);
}

void Metrics::set_aggregator_job(const std::string& job, const AggregatorJob& totals) {
  Impl::AggregatorSeries& series = impl_->aggregator_job(job);
  series.received->Increment(
      static_cast<double>(totals.bytes_received - series.last.bytes_received));
  series.sent->Increment(static_cast<double>(totals.bytes_sent - series.last.bytes_sent));
  series.summed->Increment(static_cast<double>(totals.chunks_summed - series.last.chunks_summed));
  series.waiting->Set(static_cast<double>(totals.pushes_waiting));
  series.last = totals;
}

void Metrics::aggregator_chunk_waited(const std::string& job, double seconds) {
  impl_->aggregator_job(job).wait->Observe(seconds);
}

void Metrics::aggregator_job_ended(const std::string& job) {
  const auto it = impl_->aggregator_series.find(job);
  if (it == impl_->aggregator_series.end()) return;
  impl_->aggregator_received->Remove(it->second.received);
  impl_->aggregator_sent->Remove(it->second.sent);
  impl_->aggregator_summed->Remove(it->second.summed);
  impl_->aggregator_wait->Remove(it->second.wait);
  impl_->aggregator_waiting->Remove(it->second.waiting);
  impl_->aggregator_series.erase(it);
}

void Metrics::aggregation_traffic(const std::string& aggregator, uint64_t bytes_sent,
                                  uint64_t bytes_received) {
  const prometheus::Labels labels{{"aggregator", aggregator}};
  impl_->aggregation_sent->Add(labels).Increment(static_cast<double>(bytes_sent));
  impl_->aggregation_received->Add(labels).Increment(static_cast<double>(bytes_received));
}

void Metrics::negotiated(const Negotiated& since_last) {
  impl_->cache_hits->Increment(static_cast<double>(since_last.cache_hits));
  impl_->cache_misses->Increment(static_cast<double>(since_last.cache_misses));
  impl_->cycles->Increment(static_cast<double>(since_last.cycles));
  impl_->cycle_messages->Increment(static_cast<double>(since_last.cycle_messages));
}

void Metrics::internode_allreduce(const char* algorithm) {
  prometheus::Counter*& counter = impl_->internode_allreduce_by[algorithm_index(algorithm)];
  if (counter == nullptr) {  // not ring or rhd: a label of its own, looked up
    impl_->internode_allreduces->Add({{"algorithm", algorithm}}).Increment();
    return;
  }
  counter->Increment();
}

}  // namespace gradsync::metrics
