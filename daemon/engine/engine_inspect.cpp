// What the engine tells an operator: snapshots of its state and job traces for gradsyncctl;
// once a second, stalls (warned about, or failing their jobs), unused staging memory and the
// sampled metrics.
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/node/node_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// How often the engine looks for stalled tensors and samples its metrics.
constexpr auto kStallInspectionInterval = std::chrono::seconds(1);
// A collective some ranks submitted a moment before the others is no stall (ranks run a little
// apart): what gradsyncctl, gradsync_waiting_for and the metrics call one has waited this long.
constexpr auto kStallMinimumAge = std::chrono::seconds(1);

// The job's oldest stall as it is now: on its ranks here, or waiting on other nodes.
std::optional<Stall> oldest_stall(const Job& job, Clock::time_point now) {
  std::optional<Stall> oldest = job.oldest_stall(now, kStallMinimumAge);
  if (const NodeJob* network = job.network()) {
    std::optional<Stall> across = network->oldest_stall(now, kStallMinimumAge);
    if (across && (!oldest || across->seconds > oldest->seconds)) oldest = std::move(across);
  }
  return oldest;
}

const char* state_of(const Job& job) {
  if (job.failure()) return "failed";
  if (job.formed()) return "running";
  const NodeJob* network = job.network();
  return network != nullptr && network->measuring() ? "measuring" : "forming";
}

}  // namespace

void Engine::handle(InspectEngine& command) {
  EngineSnapshot snapshot;
  for (const auto& [id, session] : sessions_) {
    const ClientIdentity& who = session->identity();
    snapshot.clients.push_back(ClientView{id, who.pid, who.uid, who.job, who.rank, who.local_rank,
                                          session->buffer_count(), session->submitted(),
                                          session->completed(), session->in_flight()});
  }
  for (const auto& [name, job] : jobs_) {
    JobView view;
    view.name = name;
    view.failure = job->failure().value_or("");
    view.state = state_of(*job);
    view.local_world_size = job->local_world_size();
    view.local_ranks = job->connected_ranks();
    view.world_size = job->world_size();
    // As it is now, not as last inspected: a wait that ended a moment ago is over.
    if (std::optional<Stall> stall = oldest_stall(*job, Clock::now())) {
      view.stall_seconds = stall->seconds;
      view.stall = std::move(stall->message);
    }
    view.traced = job->trace() != nullptr;
    view.parent = job->parent().job;
    view.parent_ranks = job->parent().ranks;
    for (const auto& [rank, reason] : job->lost_ranks()) view.lost_ranks.push_back(rank);
    const Job::Qos& qos = job->qos();
    view.share = qos.share;
    view.engine_bytes = qos.engine_bytes;
    const WirePacer::FlowCounters wire = wire_pacer_.counters(qos.flow, Clock::now());
    view.wire_bytes = wire.granted_bytes;
    view.wire_share = qos.wire_share;
    view.share_wait_seconds = qos.engine_wait_seconds + wire.waited_seconds;
    if (const NodeJob* network = job->network()) {
      view.nodes = network->layout().nodes;
      view.node_rank = network->layout().node_rank;
      view.algorithm = network->settings().algorithm;
      view.wire_codec = cost_model::wire_codec_name(network->settings().wire_codec);
      if (const auto done = network->node_0_search_done()) {
        view.autotune = *done ? "done on node 0" : "searching on node 0";
      }
    }
    if (const Autotuner* tuner = job->autotuner()) {
      view.autotune = !tuner->done() ? "searching" : tuner->cut_short() ? "cut short" : "done";
      view.autotune_trials = tuner->trials().size();
      view.autotune_best_bus_bytes_per_second = tuner->best_bus_bytes_per_second();
    }
    if (!view.autotune.empty() && job->tuned() != nullptr) view.tuned = *job->tuned();
    snapshot.jobs.push_back(std::move(view));
  }
  // The maps hold no order; operators read these in the order they connected, jobs by name.
  std::sort(snapshot.clients.begin(), snapshot.clients.end(),
            [](const ClientView& a, const ClientView& b) { return a.id < b.id; });
  std::sort(snapshot.jobs.begin(), snapshot.jobs.end(),
            [](const JobView& a, const JobView& b) { return a.name < b.name; });
  if (mesh_) {
    for (transport::PeerId peer = 0; peer < mesh_->peer_count(); ++peer) {
      const transport::PeerStats& stats = mesh_->stats(peer);
      snapshot.peers.push_back(PeerView{mesh_->address_of(peer), mesh_->failed(peer),
                                        stats.bytes_sent, stats.bytes_received, stats.errors,
                                        stats.latency_seconds, stats.bytes_per_second});
    }
  }
  if (aggregator_) snapshot.aggregated_jobs = aggregator_->jobs();
  snapshot.link_bytes_per_second = wire_pacer_.measured_link_rate();
  command.snapshot.set_value(std::move(snapshot));
}

void Engine::handle(StartTrace& command) {
  const auto refuse = [&command](std::string why) {
    TraceData data;
    data.job = command.job;
    data.error = std::move(why);
    command.result.set_value(std::move(data));
  };
  const auto it = jobs_.find(command.job);
  if (it == jobs_.end()) return refuse(fmt::format("no job '{}' on this node", command.job));
  Job& job = *it->second;
  if (job.failure()) {
    return refuse(fmt::format("job '{}' has failed: {}", command.job, *job.failure()));
  }
  if (job.trace() != nullptr) {
    return refuse(fmt::format("job '{}' is being traced already", command.job));
  }
  const TraceRecorder::Limits limits{command.steps, command.max_events,
                                     std::chrono::steady_clock::now() + command.timeout};
  job.start_trace(std::make_unique<TraceRecorder>(command.job, limits, std::move(command.result)));
  log_->info("job '{}': tracing {} steps (at most {} events, {} s)", command.job, command.steps,
             command.max_events, command.timeout.count());
}

bool Engine::inspect_stalls(Clock::time_point now) {
  if (now < next_stall_inspection_) return false;
  next_stall_inspection_ = now + kStallInspectionInterval;
  const auto warn_after = std::chrono::seconds(config_.stall_warning_seconds);
  const auto shutdown_after = std::chrono::seconds(config_.stall_shutdown_seconds);
  const auto peer_timeout = std::chrono::seconds(config_.peer_timeout_seconds);
  const auto scratch_unused = std::chrono::seconds(config_.scratch_unused_seconds);
  bool failed = false;
  std::vector<std::string> warnings;
  for (auto& [name, job] : jobs_) {
    job->check_trace(now);
    if (job->failure()) continue;
    warnings.clear();
    job->warn_stalls(now, warn_after, warnings);
    if (NodeJob* network = job->network()) {
      if (scratch_unused.count() > 0) network->release_unused_scratch(now - scratch_unused);
      network->warn_stalls(now, warn_after, warnings);
      // Waiting this long on other nodes may be their ranks being slow, or a link that carries
      // nothing any more (cut, with control messages in flight: no error comes). Their daemons
      // answer a ping only in the first case; the second fails the peer. The same for a job
      // whose nodes have not all joined (their ranks may not be there yet, or their Joined
      // messages cannot cross).
      const bool forming_long =
          job->locally_formed() && !network->formed() && now - network->created() >= peer_timeout;
      if (forming_long || network->oldest_stall(now, peer_timeout)) network->check_peers_alive();
    }
    for (const auto& warning : warnings) log_->warn("stall: {}", warning);
    const std::optional<Stall> stall = oldest_stall(*job, now);
    job->set_stall_seconds(stall ? stall->seconds : 0);
    if (stall && config_.stall_shutdown_seconds > 0 &&
        stall->seconds >= std::chrono::duration<double>(shutdown_after).count()) {
      fail_job(*job, GRADSYNC_ERR_TIMEOUT, "stalled: " + stall->message, true);
      failed = true;
    }
  }
  export_samples();
  return failed;
}

void Engine::export_job_states() {
  int64_t forming = 0;
  int64_t running = 0;
  int64_t failed = 0;
  for (const auto& [name, job] : jobs_) {
    if (job->failure()) {
      ++failed;
    } else if (job->formed()) {
      ++running;
    } else {
      ++forming;
    }
  }
  metrics_.set_jobs(forming, running, failed);
}

void Engine::report_mapping_lookups() {
  // Since the last report, from both caches (registrations count their own miss) and what the
  // looks at the rings answered themselves.
  MappingCounters now = host_buffers_.counters();
  const MappingCounters& device = device_buffers_.counters();
  now.hits += device.hits + memo_lookups_.hits;
  now.misses += device.misses;
  now.unregistered += device.unregistered + memo_lookups_.unregistered;
  using Lookup = metrics::Metrics::MappingLookup;
  if (now.hits > reported_lookups_.hits) {
    metrics_.mapping_lookups(Lookup::kHit, now.hits - reported_lookups_.hits);
  }
  if (now.misses > reported_lookups_.misses) {
    metrics_.mapping_lookups(Lookup::kMiss, now.misses - reported_lookups_.misses);
  }
  if (now.unregistered > reported_lookups_.unregistered) {
    metrics_.mapping_lookups(Lookup::kUnregistered,
                             now.unregistered - reported_lookups_.unregistered);
  }
  reported_lookups_ = now;
}

void Engine::log_autotune(Job& job) {
  const std::vector<AutotuneTrial> events = job.take_autotune_events();
  if (events.empty()) return;
  for (const AutotuneTrial& e : events) {
    if (e.chosen) {
      log_->info(
          "job '{}': autotune chose {} ({:.3f} GB/s bus){}", job.name(), describe(e.settings),
          e.bus_bytes_per_second * 1e-9,
          job.autotuner()->cut_short() ? ", its step or time bound cut the search short" : "");
    } else {
      log_->debug("job '{}': autotune stage {} round {}: {} over {} steps: {:.3f} GB/s bus",
                  job.name(), e.stage, e.round, describe(e.settings), e.steps,
                  e.bus_bytes_per_second * 1e-9);
    }
  }
  if (config_.autotune_log.empty()) return;
  // Appended a few lines at a time, rarely: opened for each batch, so that an operator may
  // move the file away.
  std::FILE* file = std::fopen(config_.autotune_log.c_str(), "a");
  if (file == nullptr) {
    log_->warn("autotune_log '{}': {}", config_.autotune_log, std::strerror(errno));
    return;
  }
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> closing(file, &std::fclose);
  if (std::ftell(file) == 0) {
    std::fputs(
        "unix_seconds,job,outcome,stage,round,fusion_threshold_bytes,piece_bytes,"
        "negotiation_hold_us,ring_min_bytes,steps,bus_bytes_per_second\n",
        file);
  }
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const AutotuneTrial& e : events) {
    fmt::print(file, "{:.3f},{},{},{},{},{},{},{},{},{},{:.0f}\n", now, job.name(),
               e.chosen ? "chosen" : "trial", e.stage, e.round, e.settings.fusion_threshold_bytes,
               e.settings.piece_bytes, e.settings.negotiation_hold_us, e.settings.ring_min_bytes,
               e.steps, e.bus_bytes_per_second);
  }
}

void Engine::export_samples() {
  export_job_states();
  if (aggregator_) aggregator_->export_metrics();
  sample_shares();
  report_mapping_lookups();
  uint64_t bytes = 0;
  for (Session* session : polled_) bytes += session->registered_bytes();
  metrics_.set_mappings(host_buffers_.mapped() + device_buffers_.mapped(), bytes);
  metrics::Metrics::JobProgress progress;
  for (const auto& [name, job] : jobs_) {
    progress.stall_seconds = job->stall_seconds();
    progress.step_bus_bandwidth = job->steps().last_bus_bandwidth();
    job->rank_progress(progress.rank_submitted, progress.rank_completed);
    progress.node_cycles.clear();
    const Job::Qos& qos = job->qos();
    progress.weight = qos.share.weight;
    progress.cap_bytes_per_second = qos.share.cap_bytes_per_second;
    progress.engine_bytes = qos.engine_bytes;
    const WirePacer::FlowCounters wire = wire_pacer_.counters(qos.flow, Clock::now());
    progress.wire_bytes = wire.granted_bytes;
    progress.wire_share = qos.wire_share;
    progress.share_wait_seconds = qos.engine_wait_seconds + wire.waited_seconds;
    progress.scratch_bytes = 0;
    if (const NodeJob* network = job->network()) {
      progress.scratch_bytes = network->scratch_bytes();
      if (network->negotiator()) progress.node_cycles = network->negotiator()->last_cycles();
    }
    progress.autotune.reset();
    if (const Autotuner* tuner = job->autotuner()) {
      // Before the job has formed across nodes, nothing is in effect yet: what node 0 announces.
      const TunedSettings& tuned = job->tuned() != nullptr ? *job->tuned() : tuner->current();
      progress.autotune = metrics::Metrics::JobProgress::Autotune{
          tuner->trials().size(),       tuner->done(),     tuner->best_bus_bytes_per_second(),
          tuned.fusion_threshold_bytes, tuned.piece_bytes, tuned.negotiation_hold_us * 1e-6,
          tuned.ring_min_bytes};
    }
    metrics_.set_job_progress(name, progress);
    log_autotune(*job);
  }
  if (mesh_) {
    for (transport::PeerId peer = 0; peer < mesh_->peer_count(); ++peer) {
      const transport::PeerStats& stats = mesh_->stats(peer);
      metrics_.set_peer_traffic(mesh_->address_of(peer), stats.bytes_sent, stats.bytes_received,
                                stats.errors);
    }
    wire_pacer_.sample(Clock::now());
    metrics_.set_link_pacer_rate(wire_pacer_.measured_link_rate());
  }
}

}  // namespace gradsync::daemon
