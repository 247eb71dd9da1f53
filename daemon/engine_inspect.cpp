// The engine's answers to an operator: a snapshot of its state, and job traces.
#include "daemon/engine.h"
#include "daemon/node/node_job.h"

#include <fmt/format.h>

#include <algorithm>

namespace gradsync::daemon {

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
    view.state = job->failure() ? "failed" : job->formed() ? "running" : "forming";
    view.local_world_size = job->local_world_size();
    view.local_ranks = job->connected_ranks();
    view.world_size = job->local_world_size();
    view.stall_seconds = job->stall_seconds();
    view.traced = job->trace() != nullptr;
    if (const NodeJob* network = job->network()) {
      view.nodes = network->layout().nodes;
      view.node_rank = network->layout().node_rank;
      view.world_size = network->layout().world_size;
      view.algorithm = network->settings().algorithm;
    }
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

}  // namespace gradsync::daemon
