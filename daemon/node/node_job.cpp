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
  if (auto error = run_blocking(probe_links(links_, scratch_, own_link_), links_)) return error;
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
                      agreed_.cache_capacity, own_link_,
                      [this](uint32_t node, capnp::MessageBuilder& message) {
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
  if (free_units_.empty()) {
    free_units_.push_back(units_.size());
    units_.emplace_back();
    unit_waits_.emplace_back();
  }
  proposal.cookie = free_units_.back();
  free_units_.pop_back();
  units_[proposal.cookie] = std::move(unit);
  unit_waits_[proposal.cookie] = {std::chrono::steady_clock::now(), false};
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

void NodeJob::count_completed(const ReadyUnit& unit, const char* allreduce_algorithm) {
  for (const auto& c : unit.collectives) {
    const ipc::Collective kind = c.first().collective;
    const char* algorithm = kind == ipc::Collective::kAllreduce ? allreduce_algorithm
                            : kind == ipc::Collective::kBarrier ? "negotiation"
                                                                : "direct";
    metrics_.collective_completed(static_cast<metrics::CollectiveKind>(kind), c.bytes(), algorithm);
  }
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
    if (auto error = take_cycle(cycle)) return error;
  }
  return progress(ran);
}

std::optional<std::string> NodeJob::take_cycle(const CycleDecisions& cycle) {
  // First what needs no network: mismatches, and small allreduces whose data came with the
  // cycle. The negotiator decides only what this node proposed: each has its unit here.
  std::vector<ReadyUnit> networked;
  networked.reserve(cycle.decisions.size());
  NodeResult error;
  for (const Decision& decision : cycle.decisions) {
    ReadyUnit unit = std::move(*units_[decision.cookie]);
    units_[decision.cookie].reset();
    free_units_.push_back(decision.cookie);
    if (!decision.error.empty()) {
      complete_unit(unit, GRADSYNC_ERR_MISMATCH, decision.error);
    } else if (const auto contributions = cycle.contributions_of(decision);
               !contributions.empty()) {
      const NodeResult bad = reduce_contributions(unit.collectives.front(), contributions);
      if (!bad) count_completed(unit, "negotiation");
      complete_unit(unit, bad ? GRADSYNC_ERR_PROTOCOL : GRADSYNC_OK, bad.value_or(""));
      if (!error) error = bad;
    } else {
      networked.push_back(std::move(unit));
    }
  }
  // Then the rest, queued in the agreed order, except that the small allreduces of one dtype
  // and op go together, fused, where the first of them would have gone. Everything this looks
  // at was agreed on (the decisions and their signatures), so every node queues the same
  // batches in the same order.
  const uint64_t cutoff = fusion_cutoff_bytes(cycle.link, links_.nodes());
  std::vector<bool> taken(networked.size(), false);
  for (size_t u = 0; u < networked.size(); ++u) {
    if (taken[u]) continue;
    Batch& batch = queued_.emplace_back(Batch{{}, cycle.link, false});
    batch.units.push_back(std::move(networked[u]));
    const ReadyUnit& first = batch.units.front();
    if (fusible(first, cutoff)) {
      const Submission& lead = first.collectives.front().first();
      uint64_t bytes = first.bytes();
      for (size_t v = u + 1; v < networked.size(); ++v) {
        if (taken[v] || !fusible(networked[v], cutoff)) continue;
        const Submission& other = networked[v].collectives.front().first();
        if (other.dtype != lead.dtype || other.op != lead.op ||
            bytes + networked[v].bytes() > agreed_.fusion_threshold_bytes) {
          continue;
        }
        bytes += networked[v].bytes();
        batch.units.push_back(std::move(networked[v]));
        taken[v] = true;
      }
      batch.fused = batch.units.size() > 1 || batch.units.front().collectives.size() > 1;
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

std::optional<std::string> NodeJob::progress(bool& ran) {
  // Each completes the moment it is done: the units in flight are independent (a group runs
  // as one task).
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    InFlight& work = **it;
    if (!work.task->poll()) {
      ++it;
      continue;
    }
    ran = true;
    NodeResult error = work.task->result();
    for (const auto& unit : work.units) {
      if (!error) count_completed(unit, work.allreduce_algorithm);
      complete_unit(unit, error ? GRADSYNC_ERR_PEER_FAILED : GRADSYNC_OK, error.value_or(""));
    }
    work.units.clear();
    if (error) return error;  // the job fails; fail_waiting completes the rest
    work.task.reset();
    spare_scratch_.push_back(std::move(work.scratch));
    it = in_flight_.erase(it);
  }
  // Start what was agreed, in the agreed order, up to the window.
  while (!queued_.empty() && in_flight_.size() < kMaxInFlight) {
    Batch batch = std::move(queued_.front());
    queued_.pop_front();
    start(std::move(batch));
    ran = true;
  }
  return std::nullopt;
}

void NodeJob::start(Batch batch) {
  auto work = std::make_unique<InFlight>();
  work->units = std::move(batch.units);
  work->link = batch.link;
  if (spare_scratch_.empty()) {
    work->scratch = std::make_unique<Scratch>();
  } else {
    work->scratch = std::move(spare_scratch_.back());
    spare_scratch_.pop_back();
  }
  // Every node starts the same collectives in the same order: each takes the next sequence
  // numbers, which keep its messages apart from those of the others in flight.
  work->first_sequence = next_sequence_;
  next_sequence_ += batch.fused ? 1 : work->units.front().collectives.size();
  InFlight& placed = *work;
  in_flight_.push_back(std::move(work));
  placed.task.emplace(batch.fused ? run_fused(placed) : run_unit(placed));
}

AllreduceAlgorithm NodeJob::choose(uint64_t bytes, const LinkFigures& link) const {
  if (links_.nodes() == 1) return AllreduceAlgorithm::kHalvingDoubling;  // the local reduce
  if (const auto forced = parse_algorithm(agreed_.algorithm)) return *forced;
  return choose_allreduce(link, links_.nodes(), bytes);
}

NodeTask NodeJob::run_unit(InFlight& work) {
  const ReadyUnit& unit = work.units.front();
  for (size_t c = 0; c < unit.collectives.size(); ++c) {
    const ReadyCollective& collective = unit.collectives[c];
    NodeStep step{links_, *work.scratch, static_cast<uint32_t>(work.first_sequence + c),
                  layout().world_size};
    std::optional<AllreduceOperand> operand;
    std::optional<NodeTask> task;
    switch (collective.first().collective) {
      case ipc::Collective::kAllreduce: {
        operand.emplace(collective);
        const AllreduceAlgorithm algorithm = choose(collective.bytes(), work.link);
        metrics_.internode_allreduce(algorithm_name(algorithm));
        work.allreduce_algorithm = algorithm_name(algorithm);
        log_->debug("job '{}': allreduce '{}' ({} bytes) as collective {} by {}", links_.job_name(),
                    collective.first().name, collective.bytes(), step.sequence,
                    algorithm_name(algorithm));
        task.emplace(algorithm == AllreduceAlgorithm::kRing
                         ? node_ring_allreduce(step, *operand)
                         : node_halving_doubling_allreduce(step, *operand));
        break;
      }
      case ipc::Collective::kBroadcast:
        task.emplace(node_broadcast(step, collective));
        break;
      case ipc::Collective::kAllgather:
        task.emplace(node_allgather(step, collective));
        break;
      case ipc::Collective::kBarrier:
        break;  // agreement among the nodes is the barrier
    }
    if (task) {
      if (auto error = co_await finish(*task)) co_return error;
    }
  }
  co_return std::nullopt;
}

NodeTask NodeJob::run_fused(InFlight& work) {
  std::vector<const ReadyCollective*> fused;
  uint64_t bytes = 0;
  for (const auto& unit : work.units) {
    for (const auto& collective : unit.collectives) {
      fused.push_back(&collective);
      bytes += collective.bytes();
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const AllreduceOperand operand(fused, work.scratch->get(kFusionScratchSlot, bytes));
  NodeStep step{links_, *work.scratch, static_cast<uint32_t>(work.first_sequence),
                layout().world_size};
  const AllreduceAlgorithm algorithm = choose(bytes, work.link);
  metrics_.internode_allreduce(algorithm_name(algorithm));
  work.allreduce_algorithm = algorithm_name(algorithm);
  log_->debug("job '{}': {} tensors fused ({} bytes) as collective {} by {}", links_.job_name(),
              fused.size(), bytes, step.sequence, algorithm_name(algorithm));
  NodeTask task = algorithm == AllreduceAlgorithm::kRing
                      ? node_ring_allreduce(step, operand)
                      : node_halving_doubling_allreduce(step, operand);
  NodeResult error = co_await finish(task);
  metrics_.batch_executed(
      bytes, fused.size(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  co_return error;
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
  for (const auto& contribution : contributions)
    contribution_inputs_.push_back(contribution.data());
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

void NodeJob::abort_after_agreed(std::string reason) {
  if (!abort_reason_) abort_reason_ = std::move(reason);
}

std::optional<std::string> NodeJob::abort_due() const {
  const bool agreed_left = busy() || (negotiator_ && negotiator_->has_decided());
  return agreed_left ? std::nullopt : abort_reason_;
}

std::optional<NodeJob::Stall> NodeJob::oldest_stall(std::chrono::steady_clock::time_point now,
                                                    std::chrono::steady_clock::duration warn_after,
                                                    std::vector<std::string>& warn) {
  std::optional<Stall> oldest;
  auto describe = [&](const ReadyUnit& unit, std::chrono::steady_clock::duration waited) {
    const std::string& name = unit.collectives.front().first().name;
    std::string nodes;
    if (negotiator_) {
      for (const uint32_t node : negotiator_->nodes_without(name)) {
        nodes += fmt::format("{}{} ({})", nodes.empty() ? "" : ", ", node, layout().nodes[node]);
      }
    }
    return fmt::format("job '{}': tensor '{}' is ready on node {} and has waited {} s for {}",
                       links_.job_name(), name, links_.me(),
                       std::chrono::duration_cast<std::chrono::seconds>(waited).count(),
                       nodes.empty() ? std::string("the other nodes (node 0 knows which)")
                                     : "node(s) " + nodes + ", which have not submitted it");
  };
  size_t oldest_slot = units_.size();
  for (size_t slot = 0; slot < units_.size(); ++slot) {
    if (!units_[slot]) continue;
    UnitWait& wait = unit_waits_[slot];
    if (now - wait.since >= warn_after && !wait.warned) {
      wait.warned = true;
      warn.push_back(describe(*units_[slot], now - wait.since));
    }
    if (oldest_slot == units_.size() || wait.since < unit_waits_[oldest_slot].since) {
      oldest_slot = slot;
    }
  }
  if (oldest_slot == units_.size()) return std::nullopt;
  const auto waited = now - unit_waits_[oldest_slot].since;
  return Stall{std::chrono::duration<double>(waited).count(),
               describe(*units_[oldest_slot], waited)};
}

void NodeJob::broadcast_abort(const std::string& reason) {
  capnp::MallocMessageBuilder message;
  start_node_message(message, links_.job_name(), links_.me()).setAbort(reason);
  links_.send_control_to_all_live(message);
}

void NodeJob::fail_waiting(gradsync_result status, const std::string& message) {
  // Unfinished tasks go first: their Flights retire what is still on the wire, with the
  // memory it may touch, before the ranks hear of the failure.
  for (auto& work : in_flight_) {
    work->task.reset();
    for (const auto& unit : work->units) complete_unit(unit, status, message);
  }
  in_flight_.clear();
  for (auto& batch : queued_) {
    for (const auto& unit : batch.units) complete_unit(unit, status, message);
  }
  queued_.clear();
  for (auto& unit : units_) {
    if (unit) complete_unit(*unit, status, message);
  }
  units_.clear();
  free_units_.clear();
  unproposed_.clear();
}

}  // namespace gradsync::daemon
