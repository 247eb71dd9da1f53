// The engine's side of the other node daemons: the mesh's messages, handshakes and failures,
// the control messages of jobs across nodes, and what peers still send to ended jobs.
#include "daemon/base/log.h"
#include "daemon/engine/engine.h"
#include "daemon/node/node_job.h"
#include "ipc/messages.h"

#include <fmt/format.h>
#include <kj/exception.h>

#include <algorithm>
#include <chrono>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// Bound on control messages kept for jobs with no local rank yet.
constexpr size_t kMaxEarlyMessages = 65536;

}  // namespace

bool Engine::poll_peers() {
  bool any = mesh_->progress();
  while (auto message = mesh_->poll_message(tags::make(tags::kControl, 0, 0, 0), tags::kKindMask)) {
    handle_node_message(message->payload, message->tag);
    any = true;
  }
  while (auto message =
             mesh_->poll_message(tags::make(tags::kAggregation, 0, 0, 0), tags::kKindMask)) {
    handle_aggregation_message(message->payload, message->tag);
    any = true;
  }
  if (aggregator_) {
    // Every announcement that arrived has been handled (the loop above found none left, and
    // UCX has not progressed since), and each posted the receives of the pushes it announced:
    // a push still unmatched was not announced, or is for a job not served (or no longer).
    if (const auto unexpected = mesh_->discard(tags::make(tags::kPush, 0, 0, 0), tags::kKindMask);
        !unexpected.empty()) {
      aggregator_->on_unexpected_pushes(unexpected);
      any = true;
    }
  }
  // Their jobs would wait for them forever.
  for (const uint64_t tag : mesh_->take_lost_messages()) {
    fail_jobs_of_tag(tag, GRADSYNC_ERR_PEER_FAILED,
                     "sent a control message that did not arrive whole (its connection broke)");
    any = true;
  }
  if (mesh_->needs_service()) any |= take_handshakes();
  if (!ended_jobs_.empty()) drain_ended_jobs();
  return take_failed_peers() || any;
}

void Engine::handle_aggregation_message(std::span<const uint8_t> payload, uint64_t tag) {
  if (aggregator_) {
    aggregator_->on_message(payload, tag);
    return;
  }
  try {
    ipc::DecodedMessage decoded(payload, kNodeMessageLimitWords);
    const auto message = decoded.root<wire::AggregationMessage>();
    if (!message.isError()) {
      // A node daemon listed as an aggregator: the job's nodes hear why nothing comes back.
      if (message.isJoin() && message.getNode() < message.getJoin().getNodes().size()) {
        log_->warn("job '{}': node {} names this daemon as an aggregator, but its role is node",
                   message.getJob().cStr(), message.getNode());
        capnp::MallocMessageBuilder reply;
        auto root = reply.initRoot<wire::AggregationMessage>();
        root.setJob(message.getJob());
        root.setIncarnation(message.getIncarnation());
        root.setFrom(listen_address_);
        root.setError("this gradsyncd's role is node, not aggregator (role = \"aggregator\")");
        const std::string address = message.getJoin().getNodes()[message.getNode()];
        mesh_->post(
            mesh_->connect(address),
            tags::make(tags::kAggregation, 0, tags::job_of_name(message.getJob().cStr()), 0),
            std::make_shared<const std::vector<uint8_t>>(ipc::encode(reply)));
      }
      return;
    }
    const auto job = jobs_.find(message.getJob().cStr());
    if (job == jobs_.end() || job->second->network() == nullptr || job->second->failure()) return;
    if (auto error = job->second->network()->on_aggregator_error(message)) {
      fail_job(*job->second, GRADSYNC_ERR_PEER_FAILED, *error, true);
    }
  } catch (const std::exception& e) {
    log_->warn("dropped a malformed message from an aggregator: {}", e.what());
  } catch (const kj::Exception& e) {
    log_->warn("dropped a malformed message from an aggregator: {}", e.getDescription().cStr());
  }
}

void Engine::drain_ended_jobs() {
  const auto now = Clock::now();
  std::erase_if(ended_jobs_, [now](const auto& entry) { return entry.second.until <= now; });
  for (const auto& entry : ended_jobs_) {
    const uint16_t tag = entry.second.tag;
    // Tags are hashed names: never drain one that a live job shares.
    const bool shared = std::any_of(jobs_.begin(), jobs_.end(), [tag](const auto& job) {
      return job.second->network() != nullptr && job.second->network()->job_tag() == tag;
    });
    // Its data only: control messages go to handle_node_message, which keeps a new job's
    // joins (a job of that name re-forming) and drops the rest.
    if (!shared) {
      for (const uint64_t kind : {tags::kData, tags::kProbe, tags::kSum}) {
        mesh_->discard(tags::make(kind, 0, tag, 0), tags::kKindMask | tags::kJobMask);
      }
    }
  }
}

bool Engine::take_failed_peers() {
  bool any = false;
  for (const transport::PeerId peer : mesh_->take_failed_peers()) {
    const std::string& reason = mesh_->failure(peer);
    const std::string what = reason.empty() ? "failed" : "failed: " + reason;
    // A peer that said goodbye was stopped on purpose: worth a line, not a warning.
    if (mesh_->left(peer)) {
      log_->info("node daemon {} {}", mesh_->address_of(peer), what);
    } else {
      log_->warn("node daemon {} {}", mesh_->address_of(peer), what);
    }
    for (auto& [name, job] : jobs_) {
      if (job->network() && job->network()->has_peer(peer)) {
        fail_job(*job, GRADSYNC_ERR_PEER_FAILED,
                 fmt::format("{} {} of job '{}' {}",
                             job->network()->is_aggregator(peer) ? "aggregator" : "node daemon",
                             mesh_->address_of(peer), name, what),
                 true);
      }
    }
    if (aggregator_) aggregator_->on_peer_failed(peer, what);
    any = true;
  }
  return any;
}

bool Engine::take_handshakes() {
  bool accepted = false;
  auto outcomes = mesh_->take_handshake_outcomes();
  for (const transport::HandshakeOutcome& outcome : outcomes) {
    metrics_.peer_handshake(outcome.accepted);
    if (outcome.accepted) {
      log_->debug("{} node daemon {}: handshake done", outcome.inbound ? "from" : "to",
                  outcome.address);
      accepted |= !outcome.inbound;
    } else if (outcome.inbound) {
      log_->warn("refused a connection from node daemon {}: {}", outcome.address, outcome.reason);
    } else {
      log_->warn("node daemon {} refused: {}", outcome.address, outcome.reason);
    }
  }
  // A job that was waiting only for its handshakes forms now.
  for (auto& [name, job] : jobs_) {
    if (!accepted || job->failure() || !job->network() || job->network()->formed()) continue;
    if (auto error = job->network()->form()) fail_job(*job, error->status, error->message, true);
  }
  return !outcomes.empty();
}

void Engine::fail_jobs_of_tag(uint64_t tag, gradsync_result status, const std::string& what) {
  const auto job_tag = tags::job_of(tag);
  const auto node = tags::node_of(tag);
  for (auto& [name, job] : jobs_) {
    if (job->network() != nullptr && job->network()->job_tag() == job_tag) {
      fail_job(*job, status, fmt::format("job '{}': node {} {}", name, node, what), true);
    }
  }
}

void Engine::handle_node_message(std::span<const uint8_t> payload, uint64_t tag) {
  // A message that cannot be read fails the jobs it may have been for: left alone, they would
  // wait for it forever.
  auto drop_malformed = [&](const std::string& what) {
    log_->warn("dropped a malformed message from a peer daemon: {}", what);
    if (tag != 0) {
      fail_jobs_of_tag(tag, GRADSYNC_ERR_PROTOCOL,
                       "sent a control message that cannot be read: " + what);
    }
  };
  try {
    ipc::DecodedMessage decoded(payload, kNodeMessageLimitWords);
    const auto message = decoded.root<wire::NodeMessage>();
    const std::string name = message.getJob();
    const auto job = jobs_.find(name);
    // Peers may be a step ahead of this node's ranks connecting: what they send is kept for the
    // job until it begins here.
    auto keep_early = [&] {
      size_t kept = 0;
      for (const auto& [job_name, messages] : early_messages_) kept += messages.size();
      if (kept < kMaxEarlyMessages) {
        early_messages_[name].emplace_back(payload.begin(), payload.end());
      }
    };
    // A job re-forming under its name (an elastic restart): a peer's new ranks may join before
    // the old job has ended here, or while what the old one's peers still send is drained.
    // A join is always the new job's, since each node joins a job once, before anything else
    // it sends for it.
    const bool earlier_job = job == jobs_.end()
                                 ? ended_jobs_.contains(name)
                                 : job->second->network() != nullptr && job->second->failure();
    if (earlier_job && message.isJoined()) {
      keep_early();
      return;
    }
    if (job == jobs_.end() || !job->second->network()) {
      // An abort for a job not here: it ended here first (its ranks all left), or never began.
      // Kept, it would fail the next job of that name. Nor is anything else kept for a job
      // that ended here.
      if (message.isAbort() || message.isRanksLost() || ended_jobs_.contains(name)) return;
      keep_early();
      return;
    }
    if (job->second->network()->for_other_incarnation(message)) {
      if (message.isJoined()) {
        keep_early();  // the peer's next job of this name, once this one has ended here
      } else {
        log_->debug("job '{}': dropped a message from node {} for an earlier instance", name,
                    message.getNode());
      }
      return;
    }
    if (message.isRanksLost()) {
      const auto lost = message.getRanksLost();
      std::vector<int32_t> ranks;
      for (const int32_t rank : lost.getRanks()) {
        if (rank >= 0 && rank < job->second->world_size()) ranks.push_back(rank);
      }
      lose_ranks(*job->second, ranks,
                 fmt::format("node {}: {}", message.getNode(), lost.getReason().cStr()));
      return;
    }
    if (message.isAbort()) {
      log_->debug("job '{}': node {} failed it: {}", name, message.getNode(),
                  message.getAbort().cStr());
      if (message.getAbortAbandoned()) {
        // The sender gave up collectives it had agreed to: what waits on it here never ends.
        fail_job(*job->second, GRADSYNC_ERR_PEER_FAILED, message.getAbort(), false);
        return;
      }
      // What every node agreed to run before the sender failed (its cycles came first, on the
      // same connection) still runs: a peer that finished the job and left has done its part.
      // The job fails once that is done (run_agreed).
      job->second->network()->abort_after_agreed(message.getAbort(), message.getAbortAfterCycle());
      run_agreed(*job->second);
      return;
    }
    if (tag != 0) job->second->network()->count_received(tag, payload.size());
    if (auto error = job->second->network()->on_message(message)) {
      fail_job(*job->second, error->status, error->message, true);
    }
  } catch (const std::exception& e) {
    drop_malformed(e.what());
  } catch (const kj::Exception& e) {
    drop_malformed(e.getDescription().cStr());
  }
}

bool Engine::run_agreed(Job& job) {
  if (job.failure()) return false;
  bool ran = false;
  if (auto error = job.network()->run_decided(ran)) {
    fail_job(job, GRADSYNC_ERR_PEER_FAILED, *error, true);
  } else if (auto reason = job.network()->abort_due()) {
    fail_job(job, GRADSYNC_ERR_PEER_FAILED, *reason, false, JobFailure::kPeerEnded);
    ran = true;
  }
  return ran;
}

}  // namespace gradsync::daemon
