#include "daemon/node/node_job.h"

#include "daemon/collectives/node_collectives.h"
#include "daemon/log.h"
#include "daemon/node/link_probe.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gradsync::daemon {
namespace {

void complete_unit(const ReadyUnit& unit, gradsync_result status, const std::string& message) {
  for (const auto& c : unit.collectives) {
    for (const auto& s : c.ranks) complete(s, status, message);
  }
}

}  // namespace

NodeJob::NodeJob(const std::string& job_name, NodeLayout layout, transport::Mesh& mesh,
                 NodeJobSettings settings, metrics::Metrics& metrics)
    : links_(job_name, std::move(layout), mesh, settings.peer_timeout),
      settings_(std::move(settings)),
      metrics_(metrics),
      log_(logger("nodes")),
      joined_(links_.nodes(), false) {}

void NodeJob::on_local_formed(std::string ranks) {
  if (local_formed_) return;
  local_formed_ = true;
  ranks_ = std::move(ranks);
  capnp::MallocMessageBuilder message;
  auto joined = start_node_message(message, links_.job_name(), links_.me()).initJoined();
  joined.setCacheCapacity(settings_.cache_capacity);
  joined.setAlgorithm(settings_.algorithm);
  joined.setFusionThresholdBytes(settings_.fusion_threshold_bytes);
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
    agreed_.fusion_threshold_bytes = joined.getFusionThresholdBytes();
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
      "{:.2f} GB/s; response cache {} entries, algorithm {}, fusion up to {} bytes",
      links_.job_name(), links_.nodes(), (links_.me() + links_.nodes() - 1) % links_.nodes(),
      own_link_.alpha_seconds * 1e6,
      own_link_.beta_seconds_per_byte > 0 ? 1e-9 / own_link_.beta_seconds_per_byte : 0.0,
      own_link_.gamma_seconds_per_byte > 0 ? 1e-9 / own_link_.gamma_seconds_per_byte : 0.0,
      agreed_.cache_capacity, agreed_.algorithm, agreed_.fusion_threshold_bytes);
  if (links_.nodes() > 1) {
    const uint32_t left = (links_.me() + links_.nodes() - 1) % links_.nodes();
    metrics_.peer_link_measured(
        layout().nodes[left], own_link_.alpha_seconds,
        own_link_.beta_seconds_per_byte > 0 ? 1 / own_link_.beta_seconds_per_byte : 0);
  }
  negotiator_.emplace(links_.job_name(), links_.nodes(), links_.me(), ranks_,
                      agreed_.cache_capacity, own_link_, [this](uint32_t node, capnp::MessageBuilder& message) {
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
  proposal.signature = {lead.collective,
                        lead.dtype,
                        lead.op,
                        lead.count,
                        static_cast<uint32_t>(unit.collectives.size()),
                        lead.collective == ipc::Collective::kBroadcast ? lead.root : -1};
  const ReadyCollective& only = unit.collectives.front();
  if (unit.collectives.size() == 1 && lead.collective == ipc::Collective::kAllreduce &&
      only.bytes() <= kEagerMaxBytes) {
    // Small enough to travel with the negotiation: this node's part, reduced over its ranks.
    proposal.eager.resize(only.bytes());
    AllreduceOperand(only, proposal.eager.data())
        .reduce_into(node_detail::network_op(lead.op), 0, lead.count, nullptr);
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

void NodeJob::report_negotiation() {
  const Negotiator::Counters& counters = negotiator_->counters();
  if (counters.cycles != reported_counters_.cycles ||
      counters.cache_hits != reported_counters_.cache_hits ||
      counters.cache_misses != reported_counters_.cache_misses) {
    metrics_.negotiated(counters.cache_hits - reported_counters_.cache_hits,
                        counters.cache_misses - reported_counters_.cache_misses,
                        counters.cycles - reported_counters_.cycles);
    reported_counters_ = counters;
  }
}

std::optional<std::string> NodeJob::run_decided(bool& ran) {
  ran = false;
  if (!negotiator_) return std::nullopt;
  report_negotiation();
  auto& decided = negotiator_->decided();
  while (!decided.empty()) {
    const CycleDecisions cycle = std::move(decided.front());
    decided.pop_front();
    ran = true;
    if (auto error = run_cycle(cycle)) return error;
  }
  return std::nullopt;
}

std::optional<std::string> NodeJob::run_cycle(const CycleDecisions& cycle) {
  // First what needs no network: mismatches, and small allreduces whose data came with the
  // cycle. The negotiator decides only what this node proposed: each has its unit here.
  std::vector<ReadyUnit> networked;
  networked.reserve(cycle.decisions.size());
  NodeResult error;
  for (const Decision& decision : cycle.decisions) {
    auto& waiting = units_.find(decision.key)->second;
    ReadyUnit unit = std::move(waiting.front());
    waiting.pop_front();
    // The entry stays: the same name comes back next step (swept in on_locally_ready).
    if (!decision.error.empty()) {
      complete_unit(unit, GRADSYNC_ERR_MISMATCH, decision.error);
    } else if (const auto contributions = cycle.contributions_of(decision);
               !contributions.empty()) {
      const NodeResult bad = reduce_contributions(unit.collectives.front(), contributions);
      complete_unit(unit, bad ? GRADSYNC_ERR_PROTOCOL : GRADSYNC_OK, bad.value_or(""));
      if (!error) error = bad;
    } else {
      networked.push_back(std::move(unit));
    }
  }
  // Then the rest in the agreed order, except that the small allreduces of one dtype and op
  // run together, fused, where the first of them would have run. Everything this looks at was
  // agreed on (the decisions and their signatures), so every node runs the same batches in the
  // same order. After an error nothing more of the cycle can run: the job fails.
  const uint64_t cutoff = fusion_cutoff_bytes(cycle.link, links_.nodes());
  std::vector<bool> done(networked.size(), false);
  std::vector<size_t> batch;
  for (size_t u = 0; u < networked.size(); ++u) {
    if (done[u]) continue;
    batch.assign(1, u);
    if (!error && fusible(networked[u], cutoff)) {
      const Submission& lead = networked[u].collectives.front().first();
      uint64_t bytes = networked[u].bytes();
      for (size_t v = u + 1; v < networked.size(); ++v) {
        const Submission& other = networked[v].collectives.front().first();
        if (done[v] || !fusible(networked[v], cutoff) || other.dtype != lead.dtype ||
            other.op != lead.op || bytes + networked[v].bytes() > agreed_.fusion_threshold_bytes) {
          continue;
        }
        bytes += networked[v].bytes();
        batch.push_back(v);
      }
    }
    if (!error) {
      error = batch.size() > 1 ? execute_fused(networked, batch, cycle.link)
                               : execute(networked[u], cycle.link);
    }
    for (const size_t b : batch) {
      done[b] = true;
      complete_unit(networked[b], error ? GRADSYNC_ERR_PEER_FAILED : GRADSYNC_OK,
                    error.value_or(""));
    }
  }
  return error;
}

bool NodeJob::fusible(const ReadyUnit& unit, uint64_t cutoff) const {
  const Submission& lead = unit.collectives.front().first();
  return unit.bytes() < cutoff && unit.bytes() <= agreed_.fusion_threshold_bytes &&
         std::all_of(unit.collectives.begin(), unit.collectives.end(),
                     [&lead](const ReadyCollective& c) {
                       return c.first().collective == ipc::Collective::kAllreduce &&
                              c.first().dtype == lead.dtype && c.first().op == lead.op;
                     });
}

NodeStep NodeJob::next_step() {
  // Every node runs the same collectives in the same order: each gets the next sequence
  // number, which keeps its messages apart from its neighbours'.
  return NodeStep{links_, scratch_, static_cast<uint32_t>(next_sequence_++), layout().world_size};
}

NodeResult NodeJob::allreduce(const AllreduceOperand& operand, const LinkFigures& link) {
  const uint64_t bytes = operand.count() * operand.element_bytes();
  const auto forced = parse_algorithm(agreed_.algorithm);
  const AllreduceAlgorithm algorithm =
      forced ? *forced : choose_allreduce(link, links_.nodes(), bytes);
  metrics_.internode_allreduce(algorithm_name(algorithm));
  NodeStep step = next_step();
  log_->debug("job '{}': allreduce '{}' ({} bytes) as collective {} by {}", links_.job_name(),
              operand.name(), bytes, step.sequence, algorithm_name(algorithm));
  return algorithm == AllreduceAlgorithm::kRing ? node_ring_allreduce(step, operand)
                                                : node_halving_doubling_allreduce(step, operand);
}

NodeResult NodeJob::execute(const ReadyUnit& unit, const LinkFigures& link) {
  for (const auto& collective : unit.collectives) {
    NodeResult error;
    switch (collective.first().collective) {
      case ipc::Collective::kAllreduce:
        error = allreduce(AllreduceOperand(collective), link);
        break;
      case ipc::Collective::kBroadcast: {
        NodeStep step = next_step();
        error = node_broadcast(step, collective);
        break;
      }
      case ipc::Collective::kAllgather: {
        NodeStep step = next_step();
        error = node_allgather(step, collective);
        break;
      }
      case ipc::Collective::kBarrier:
        break;  // agreement among the nodes is the barrier
    }
    if (error) return error;
  }
  return std::nullopt;
}

NodeResult NodeJob::execute_fused(const std::vector<ReadyUnit>& units,
                                  const std::vector<size_t>& batch, const LinkFigures& link) {
  std::vector<const ReadyCollective*> fused;
  uint64_t bytes = 0;
  for (const size_t u : batch) {
    for (const auto& collective : units[u].collectives) {
      fused.push_back(&collective);
      bytes += collective.bytes();
    }
  }
  const auto start = std::chrono::steady_clock::now();
  NodeResult error =
      allreduce(AllreduceOperand(fused, scratch_.get(kFusionScratchSlot, bytes)), link);
  metrics_.batch_executed(
      bytes, fused.size(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return error;
}

NodeResult NodeJob::reduce_contributions(const ReadyCollective& collective,
                                         std::span<const std::span<const uint8_t>> contributions) {
  const Submission& lead = collective.first();
  for (const auto& contribution : contributions) {
    if (contribution.size() != collective.bytes()) {
      return fmt::format("job '{}': a node sent {} bytes for '{}', which has {}", links_.job_name(),
                         contribution.size(), lead.name, collective.bytes());
    }
  }
  // Gathered in a buffer kept between calls: this runs for every small tensor of a step.
  contribution_inputs_.clear();
  for (const auto& contribution : contributions) contribution_inputs_.push_back(contribution.data());
  const std::vector<const void*>& inputs = contribution_inputs_;
  // Every node adds the same contributions in the same (node) order: the same result
  // everywhere, to the bit.
  const AllreduceOperand operand(collective);
  void* outputs[] = {operand.work()};
  kernels::reduce_to_all(lead.dtype, node_detail::network_op(lead.op), inputs.data(), inputs.size(),
                         outputs, 1, lead.count, false);
  if (lead.op == GRADSYNC_AVG) {
    kernels::divide(lead.dtype, operand.work(), lead.count,
                    static_cast<uint64_t>(layout().world_size));
  }
  operand.deliver(0, lead.count);
  return std::nullopt;
}

void NodeJob::broadcast_abort(const std::string& reason) {
  capnp::MallocMessageBuilder message;
  start_node_message(message, links_.job_name(), links_.me()).setAbort(reason);
  links_.send_control_to_all_live(message);
}

void NodeJob::fail_waiting(gradsync_result status, const std::string& message) {
  for (auto& [key, units] : units_) {
    for (auto& unit : units) complete_unit(unit, status, message);
  }
  units_.clear();
  unproposed_.clear();
}

}  // namespace gradsync::daemon
