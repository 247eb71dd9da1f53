#include "daemon/node/node_job.h"

#include "daemon/collectives/node_collectives.h"
#include "daemon/log.h"
#include "daemon/node/link_probe.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gradsync::daemon {

NodeJob::NodeJob(const std::string& job_name, NodeLayout layout, transport::Mesh& mesh,
                 NodeJobSettings settings, metrics::Metrics& metrics)
    : links_(job_name, std::move(layout), mesh, settings.peer_timeout),
      settings_(std::move(settings)),
      metrics_(metrics),
      log_(logger("nodes")),
      joined_(links_.nodes(), false) {}

void NodeJob::on_local_formed() {
  if (local_formed_) return;
  local_formed_ = true;
  capnp::MallocMessageBuilder message;
  auto joined = start_node_message(message, links_.job_name(), links_.me()).initJoined();
  joined.setCacheCapacity(settings_.cache_capacity);
  joined.setAlgorithm(settings_.algorithm);
  for (uint32_t node = 0; node < links_.nodes(); ++node) {
    if (node != links_.me()) links_.send_control(node, message);
  }
  log_->debug("job '{}': node {} joined", links_.job_name(), links_.me());
}

void NodeJob::on_joined(uint32_t node, wire::Joined::Reader joined) {
  if (joined_[node]) return;
  joined_[node] = true;
  if (node == 0) {
    agreed_.cache_capacity = joined.getCacheCapacity();
    agreed_.algorithm = joined.getAlgorithm();
  }
}

std::string NodeJob::missing_nodes() const {
  std::string missing;
  for (uint32_t node = 0; node < joined_.size(); ++node) {
    if (!joined_[node] && node != links_.me()) {
      missing +=
          fmt::format("{}node {} ({})", missing.empty() ? "" : ", ", node, layout().nodes[node]);
    }
  }
  return missing;
}

std::optional<std::string> NodeJob::form() {
  if (negotiator_ || !local_formed_) return std::nullopt;
  for (uint32_t node = 0; node < joined_.size(); ++node) {
    if (node != links_.me() && !joined_[node]) return std::nullopt;
  }
  if (links_.me() == 0) agreed_ = settings_;
  if (auto error = probe_links(links_, scratch_, own_link_)) return error;
  log_->info(
      "job '{}' formed on {} nodes; link to node {}: alpha {:.1f} us, beta {:.3f} GB/s; reduce "
      "{:.2f} GB/s; response cache {} entries, algorithm {}",
      links_.job_name(), links_.nodes(), (links_.me() + links_.nodes() - 1) % links_.nodes(),
      own_link_.alpha_seconds * 1e6,
      own_link_.beta_seconds_per_byte > 0 ? 1e-9 / own_link_.beta_seconds_per_byte : 0.0,
      own_link_.gamma_seconds_per_byte > 0 ? 1e-9 / own_link_.gamma_seconds_per_byte : 0.0,
      agreed_.cache_capacity, agreed_.algorithm);
  if (links_.nodes() > 1) {
    const uint32_t left = (links_.me() + links_.nodes() - 1) % links_.nodes();
    metrics_.peer_link_measured(
        layout().nodes[left], own_link_.alpha_seconds,
        own_link_.beta_seconds_per_byte > 0 ? 1 / own_link_.beta_seconds_per_byte : 0);
  }
  negotiator_.emplace(links_.job_name(), links_.nodes(), links_.me(), agreed_.cache_capacity,
                      own_link_, [this](uint32_t node, capnp::MessageBuilder& message) {
                        links_.send_control(node, message);
                      });
  try {
    for (auto& early : early_) {
      if (auto error = on_message(early->getRoot<wire::NodeMessage>().asReader())) return error;
    }
    early_.clear();
    for (auto& proposal : unproposed_) negotiator_->propose(std::move(proposal));
    unproposed_.clear();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return std::nullopt;
}

void NodeJob::on_locally_ready(ReadyUnit unit, bool more_coming) {
  // Nodes may assemble a group in different orders: run its members in name order, and name
  // the group by its first member, so that every node agrees on both.
  std::sort(unit.collectives.begin(), unit.collectives.end(),
            [](const ReadyCollective& a, const ReadyCollective& b) {
              return a.first().name < b.first().name;
            });
  const Submission& lead = unit.collectives.front().first();
  Proposal proposal;
  proposal.key = lead.name;
  proposal.collective = lead.collective;
  proposal.dtype = lead.dtype;
  proposal.op = lead.op;
  proposal.count = lead.count;
  proposal.members = static_cast<uint32_t>(unit.collectives.size());
  proposal.root = lead.collective == ipc::Collective::kBroadcast ? lead.root : -1;
  for (const Submission& s : unit.collectives.front().ranks) {
    proposal.ranks +=
        fmt::format("{}{}", proposal.ranks.empty() ? "ranks " : ", ", s.session->identity().rank);
  }
  const ReadyCollective& only = unit.collectives.front();
  if (unit.collectives.size() == 1 && lead.collective == ipc::Collective::kAllreduce &&
      only.bytes() <= kEagerMaxBytes) {
    // Small enough to travel with the negotiation: this node's part, reduced over its ranks.
    proposal.eager.resize(only.bytes());
    node_detail::reduce_into(only, node_detail::network_op(lead.op), proposal.eager.data(), 0,
                             lead.count, nullptr);
  }
  if (units_.size() > (1 << 16)) {
    std::erase_if(units_, [](const auto& entry) { return entry.second.empty(); });
  }
  units_[proposal.key].push_back(std::move(unit));
  if (negotiator_) {
    negotiator_->propose(std::move(proposal), more_coming);
  } else {
    unproposed_.push_back(std::move(proposal));
  }
}

std::optional<std::string> NodeJob::on_message(wire::NodeMessage::Reader message) {
  const uint32_t node = message.getNode();
  if (node >= links_.nodes() || node == links_.me()) {
    return fmt::format("job '{}': a control message claims to be from node {}", links_.job_name(),
                       node);
  }
  try {
    switch (message.which()) {
      case wire::NodeMessage::JOINED:
        on_joined(node, message.getJoined());
        return form();
      case wire::NodeMessage::CYCLE:
      case wire::NodeMessage::RESPONSE:
        if (!negotiator_) {
          // A node that formed first has started negotiating: keep it for when we have.
          auto copy = std::make_unique<capnp::MallocMessageBuilder>();
          copy->setRoot(message);
          early_.push_back(std::move(copy));
        } else if (message.isCycle()) {
          negotiator_->on_cycle(node, message.getCycle());
        } else {
          negotiator_->on_response(node, message.getResponse());
        }
        return std::nullopt;
      case wire::NodeMessage::ABORT:
        return std::nullopt;  // handled by the engine, which fails the whole job
    }
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return std::nullopt;
}

std::optional<ReadyUnit> NodeJob::next_runnable() {
  if (!negotiator_) return std::nullopt;
  const Negotiator::Counters& counters = negotiator_->counters();
  if (counters.cycles != reported_counters_.cycles ||
      counters.cache_hits != reported_counters_.cache_hits) {
    metrics_.negotiated(counters.cache_hits - reported_counters_.cache_hits,
                        counters.cache_misses - reported_counters_.cache_misses,
                        counters.cycles - reported_counters_.cycles);
    reported_counters_ = counters;
  }
  auto& decided = negotiator_->decided();
  while (!decided.empty()) {
    Decision decision = std::move(decided.front());
    decided.pop_front();
    // The negotiator decides only what this node proposed.
    auto waiting = units_.find(decision.key);
    ReadyUnit unit = std::move(waiting->second.front());
    waiting->second.pop_front();
    // The entry stays: the same name comes back next step (swept in on_locally_ready).
    if (decision.error.empty()) {
      contributions_ = std::move(decision.contributions);
      return unit;
    }
    for (auto& c : unit.collectives) {
      for (auto& s : c.ranks) complete(s, GRADSYNC_ERR_MISMATCH, decision.error);
    }
  }
  return std::nullopt;
}

AllreduceAlgorithm NodeJob::choose(const ReadyCollective& collective) const {
  if (auto forced = parse_algorithm(agreed_.algorithm)) return *forced;
  return choose_allreduce(negotiator_->agreed_link(), links_.nodes(), collective.bytes());
}

std::optional<std::string> NodeJob::execute(ReadyUnit& unit) {
  for (auto& collective : unit.collectives) {
    // Every node runs the same collectives in the same order: each gets the next sequence
    // number, which keeps its messages apart from its neighbours'.
    NodeStep step{links_, scratch_, static_cast<uint32_t>(next_sequence_++), layout().world_size};
    NodeResult error;
    if (!contributions_.empty()) {
      error = reduce_contributions(collective);
      contributions_.clear();
    } else {
      switch (collective.first().collective) {
        case ipc::Collective::kAllreduce: {
          const AllreduceAlgorithm algorithm = choose(collective);
          metrics_.internode_allreduce(algorithm_name(algorithm));
          log_->debug("job '{}': allreduce '{}' ({} bytes) as collective {} by {}",
                      links_.job_name(), collective.first().name, collective.bytes(), step.sequence,
                      algorithm_name(algorithm));
          error = algorithm == AllreduceAlgorithm::kRing
                      ? node_ring_allreduce(step, collective)
                      : node_halving_doubling_allreduce(step, collective);
          break;
        }
        case ipc::Collective::kBroadcast:
          error = node_broadcast(step, collective);
          break;
        case ipc::Collective::kAllgather:
          error = node_allgather(step, collective);
          break;
        case ipc::Collective::kBarrier:
          break;  // agreement among the nodes is the barrier
      }
    }
    if (error) {
      for (auto& c : unit.collectives) {
        for (auto& s : c.ranks) complete(s, GRADSYNC_ERR_PEER_FAILED, *error);
      }
      return error;
    }
  }
  for (auto& c : unit.collectives) {
    for (auto& s : c.ranks) complete(s, GRADSYNC_OK);
  }
  return std::nullopt;
}

NodeResult NodeJob::reduce_contributions(const ReadyCollective& collective) {
  const Submission& lead = collective.first();
  std::vector<const void*> inputs;
  for (const auto& contribution : contributions_) {
    if (contribution.size() != collective.bytes()) {
      return fmt::format("job '{}': a node sent {} bytes for '{}', which has {}", links_.job_name(),
                         contribution.size(), lead.name, collective.bytes());
    }
    inputs.push_back(contribution.data());
  }
  // Every node adds the same contributions in the same (node) order: the same result
  // everywhere, to the bit.
  uint8_t* result = collective.ranks.front().recv;
  void* outputs[] = {result};
  kernels::reduce_to_all(lead.dtype, node_detail::network_op(lead.op), inputs.data(), inputs.size(),
                         outputs, 1, lead.count, false);
  if (lead.op == GRADSYNC_AVG) {
    kernels::divide(lead.dtype, result, lead.count, static_cast<uint64_t>(layout().world_size));
  }
  node_detail::copy_to_other_ranks(collective, result, 0, lead.count);
  return std::nullopt;
}

void NodeJob::broadcast_abort(const std::string& reason) {
  capnp::MallocMessageBuilder message;
  start_node_message(message, links_.job_name(), links_.me()).setAbort(reason);
  links_.send_control_to_all_live(message);
}

void NodeJob::fail_waiting(gradsync_result status, const std::string& message) {
  for (auto& [key, units] : units_) {
    for (auto& unit : units) {
      for (auto& c : unit.collectives) {
        for (auto& s : c.ranks) complete(s, status, message);
      }
    }
  }
  units_.clear();
  unproposed_.clear();
}

}  // namespace gradsync::daemon
