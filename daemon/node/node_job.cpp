#include "daemon/node/node_job.h"

#include "daemon/base/log.h"
#include "daemon/collectives/internode/node_collectives.h"
#include "daemon/collectives/local/device_work.h"
#include "daemon/links/aggregation_plan.h"
#include "daemon/node/link_probe.h"
#include "kernels/reduce.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <random>
#include <stdexcept>

namespace gradsync::daemon {
NodeJob::NodeJob(const std::string& job_name, NodeLayout layout, transport::Transport& transport,
                 NodeJobSettings settings, metrics::Metrics& metrics, DeviceStreams& device_streams)
    : links_(job_name, std::move(layout), transport, settings.peer_timeout),
      settings_(std::move(settings)),
      metrics_(metrics),
      device_streams_(device_streams),
      log_(logger("nodes")),
      rank_nodes_(links_.nodes(), links_.layout().world_size),
      joined_(links_.nodes(), false),
      incarnation_(std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1),
      peer_incarnations_(links_.nodes(), 0) {
  links_.set_incarnation(incarnation_);
  reported_aggregation_.resize(links_.aggregators());
}

NodeJob::~NodeJob() {
  // What the job held back goes with it.
  if (reported_held_bytes_ != 0) metrics_.topk_held(-static_cast<int64_t>(reported_held_bytes_), 0);
  report_aggregation();
  leave_aggregators("");
}

void NodeJob::join_aggregators() {
  if (links_.aggregators() == 0) return;
  for (uint32_t a = 0; a < links_.aggregators(); ++a) {
    capnp::MallocMessageBuilder message;
    auto root = message.initRoot<wire::AggregationMessage>();
    root.setJob(links_.job_name());
    root.setNode(links_.me());
    root.setIncarnation(incarnation_);
    auto join = root.initJoin();
    const auto& nodes = layout().nodes;
    auto node_list = join.initNodes(static_cast<unsigned>(nodes.size()));
    for (unsigned i = 0; i < nodes.size(); ++i) node_list.set(i, nodes[i]);
    const auto& aggregators = layout().aggregators;
    auto aggregator_list = join.initAggregators(static_cast<unsigned>(aggregators.size()));
    for (unsigned i = 0; i < aggregators.size(); ++i) aggregator_list.set(i, aggregators[i]);
    join.setIndex(a);
    join.setChunkBytes(agreed_.aggregation_chunk_bytes);
    links_.send_to_aggregator(a, message);
  }
  aggregators_joined_ = true;
}

void NodeJob::leave_aggregators(const std::string& reason) {
  if (!aggregators_joined_) return;
  aggregators_joined_ = false;
  for (uint32_t a = 0; a < links_.aggregators(); ++a) {
    if (links_.transport().failed(links_.aggregator_peer(a))) continue;
    capnp::MallocMessageBuilder message;
    auto root = message.initRoot<wire::AggregationMessage>();
    root.setJob(links_.job_name());
    root.setNode(links_.me());
    root.setIncarnation(incarnation_);
    root.setLeave(reason);
    links_.send_to_aggregator(a, message);
  }
}

std::optional<std::string> NodeJob::on_aggregator_error(
    wire::AggregationMessage::Reader message) const {
  if (!message.isError() || message.getIncarnation() != incarnation_) return std::nullopt;
  return fmt::format("aggregator {} of job '{}': {}", message.getFrom().cStr(), links_.job_name(),
                     message.getError().cStr());
}

void NodeJob::report_aggregation() {
  const auto& traffic = links_.aggregator_traffic();
  for (uint32_t a = 0; a < traffic.size(); ++a) {
    NodeLinks::AggregatorTraffic& reported = reported_aggregation_[a];
    if (traffic[a].bytes_sent == reported.bytes_sent &&
        traffic[a].bytes_received == reported.bytes_received) {
      continue;
    }
    metrics_.aggregation_traffic(layout().aggregators[a],
                                 traffic[a].bytes_sent - reported.bytes_sent,
                                 traffic[a].bytes_received - reported.bytes_received);
    reported = traffic[a];
  }
}

void NodeJob::on_local_formed(std::vector<int32_t> ranks) {
  if (local_formed_ || failed_) return;
  local_formed_ = true;
  std::sort(ranks.begin(), ranks.end());
  ranks_ = fmt::format("ranks {}", fmt::join(ranks, ", "));
  rank_nodes_.add(links_.me(), ranks);
  capnp::MallocMessageBuilder message;
  auto joined = start_node_message(message, links_.job_name(), links_.me()).initJoined();
  joined.setCacheCapacity(settings_.cache_capacity);
  joined.setAlgorithm(settings_.algorithm);
  joined.setFusionThresholdBytes(settings_.fusion_threshold_bytes);
  joined.setPieceBytes(settings_.piece_bytes);
  joined.setWireCodec(cost_model::wire_codec_name(settings_.wire_codec));
  joined.setSlowLinkMessageBytes(settings_.slow_link_message_bytes);
  joined.setRelayMinNodes(settings_.relay_min_nodes);
  joined.setAggregationChunkBytes(settings_.aggregation_chunk_bytes);
  const auto& aggregators = layout().aggregators;
  auto aggregator_list = joined.initAggregators(static_cast<unsigned>(aggregators.size()));
  for (unsigned i = 0; i < aggregators.size(); ++i) aggregator_list.set(i, aggregators[i]);
  auto own_ranks = joined.initRanks(static_cast<unsigned>(ranks.size()));
  for (unsigned i = 0; i < ranks.size(); ++i) own_ranks.set(i, ranks[i]);
  for (uint32_t node = 0; node < links_.nodes(); ++node) {
    if (node != links_.me()) send_control(node, message);
  }
  log_->debug("job '{}': node {} joined", links_.job_name(), links_.me());
}

void NodeJob::stamp(uint32_t node, capnp::MessageBuilder& message) const {
  auto root = message.getRoot<wire::NodeMessage>();
  root.setIncarnation(incarnation_);
  root.setPeerIncarnation(peer_incarnations_[node]);
}

void NodeJob::send_control(uint32_t node, capnp::MessageBuilder& message) {
  stamp(node, message);
  links_.send_control(node, message);
}

bool NodeJob::for_other_incarnation(wire::NodeMessage::Reader message) const {
  const uint32_t node = message.getNode();
  if (node >= links_.nodes()) return false;  // on_message refuses it
  if (message.isJoined()) {
    return joined_[node] && message.getIncarnation() != peer_incarnations_[node];
  }
  return message.getPeerIncarnation() != 0 && message.getPeerIncarnation() != incarnation_;
}

void NodeJob::on_joined(uint32_t node, wire::Joined::Reader joined, uint64_t incarnation) {
  if (joined_[node]) return;
  joined_[node] = true;
  peer_incarnations_[node] = incarnation;
  // No node has more ranks than the job: more is some other fault, which the map names as a
  // rank outside WORLD_SIZE or one on two nodes.
  const auto list = joined.getRanks();
  std::vector<int32_t> ranks;
  const auto world = static_cast<unsigned>(std::max(links_.layout().world_size, 0));
  for (unsigned i = 0; i < list.size() && i <= world; ++i) ranks.push_back(list[i]);
  rank_nodes_.add(node, ranks);
  std::vector<std::string> aggregators;
  for (auto aggregator : joined.getAggregators()) aggregators.emplace_back(aggregator.cStr());
  if (aggregators != layout().aggregators) {
    throw std::invalid_argument(fmt::format(
        "job '{}': node {}'s ranks name the aggregators [{}], this node's [{}]: every node's "
        "must name the same (GRADSYNC_AGGREGATORS)",
        links_.job_name(), node, fmt::join(aggregators, ", "),
        fmt::join(layout().aggregators, ", ")));
  }
  if (node == 0) {
    agreed_.aggregation_chunk_bytes = joined.getAggregationChunkBytes();
    if (!layout().aggregators.empty() &&
        (agreed_.aggregation_chunk_bytes < aggregation::kMinChunkBytes ||
         agreed_.aggregation_chunk_bytes > aggregation::kMaxChunkBytes)) {
      throw std::invalid_argument(fmt::format("job '{}': node 0 asked for chunks of {} bytes",
                                              links_.job_name(), agreed_.aggregation_chunk_bytes));
    }
    agreed_.slow_link_message_bytes = joined.getSlowLinkMessageBytes();
    agreed_.relay_min_nodes = joined.getRelayMinNodes();
    agreed_.cache_capacity = joined.getCacheCapacity();
    agreed_.algorithm = joined.getAlgorithm();
    agreed_.fusion_threshold_bytes = joined.getFusionThresholdBytes();
    agreed_.piece_bytes = joined.getPieceBytes();
    if (agreed_.piece_bytes < kMinTunedPieceBytes || agreed_.piece_bytes > kMaxTunedPieceBytes) {
      throw std::invalid_argument(fmt::format("job '{}': node 0 asked for pieces of {} bytes",
                                              links_.job_name(), agreed_.piece_bytes));
    }
    const std::string name = joined.getWireCodec().cStr();
    const auto codec = cost_model::parse_wire_codec(name.empty() ? "none" : name);
    if (!codec) {
      throw std::invalid_argument(fmt::format("job '{}': node 0 asked for wire codec '{}'",
                                              links_.job_name(), joined.getWireCodec().cStr()));
    }
    agreed_.wire_codec = *codec;
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

std::optional<NodeJobError> NodeJob::form() {
  // Measuring the links sends data, which waits for every handshake to end. A job that failed
  // (a last local rank may attach, or a peer's join arrive, after that) never forms: it would
  // measure against peers that ended it.
  if (failed_ || negotiator_ || probe_ || !local_formed_ || !links_.authenticated()) {
    return std::nullopt;
  }
  for (uint32_t node = 0; node < joined_.size(); ++node) {
    if (node != links_.me() && !joined_[node]) return std::nullopt;
  }
  if (auto problem = rank_nodes_.problem()) {
    return NodeJobError(GRADSYNC_ERR_INVALID_ARGUMENT,
                        fmt::format("job '{}': {}: every rank needs a RANK of its own, below "
                                    "WORLD_SIZE, on one of GRADSYNC_NODES",
                                    links_.job_name(), *problem));
  }
  if (links_.me() == 0) agreed_ = settings_;
  // The engine drives the probe as it does the collectives (run_decided), serving every other
  // job meanwhile: a peer that stops answering holds up this job only, until the peer timeout.
  probe_.emplace(probe_links(links_, scratch_, own_link_));
  return finish_forming();
}

std::optional<std::string> NodeJob::finish_forming() {
  if (!probe_ || !probe_->poll()) return std::nullopt;
  NodeResult error = probe_->result();
  probe_.reset();
  if (error) return error;
  // Every node relays, or none: node 0's threshold is agreed.
  const bool relay = agreed_.relay_min_nodes > 0 && links_.nodes() >= agreed_.relay_min_nodes;
  log_->info(
      "job '{}' formed on {} nodes; link to node {}: alpha {:.1f} us, beta {:.3f} GB/s; reduce "
      "{:.2f} GB/s; response cache {} entries, algorithm {}, wire codec {}, fusion up to {} bytes, "
      "bulk data on slow links in messages of {} bytes, negotiation cycles {}",
      links_.job_name(), links_.nodes(), (links_.me() + links_.nodes() - 1) % links_.nodes(),
      own_link_.alpha_seconds * 1e6,
      own_link_.beta_seconds_per_byte > 0 ? 1e-9 / own_link_.beta_seconds_per_byte : 0.0,
      own_link_.gamma_seconds_per_byte > 0 ? 1e-9 / own_link_.gamma_seconds_per_byte : 0.0,
      agreed_.cache_capacity, agreed_.algorithm, cost_model::wire_codec_name(agreed_.wire_codec),
      agreed_.fusion_threshold_bytes, agreed_.slow_link_message_bytes,
      relay ? "relayed" : "to every node");
  publish_own_link();
  join_aggregators();
  tuned_ = TunedSettings{agreed_.fusion_threshold_bytes, agreed_.piece_bytes,
                         static_cast<uint32_t>(settings_.join_hold.count()), 0};
  negotiator_.emplace(
      links_.job_name(), links_.nodes(), links_.me(), ranks_, agreed_.cache_capacity, own_link_,
      [this](uint32_t node, capnp::MessageBuilder& message) { send_control(node, message); },
      settings_.join_hold.count() > 0, relay ? CycleRoute::kRelayed : CycleRoute::kDirect);
  if (announced_) negotiator_->announce(*announced_);
  try {
    for (auto& early : early_) {
      if (auto error = on_message(early->getRoot<wire::NodeMessage>().asReader())) {
        return error->message;
      }
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
  links_.note_collective();
  // Nodes may assemble a group in different orders: run its members in name order, and name
  // the group by its first member, so that every node agrees on both.
  std::sort(unit.collectives.begin(), unit.collectives.end(),
            [](const ReadyCollective& a, const ReadyCollective& b) {
              return a.first().name < b.first().name;
            });
  const Submission& lead = unit.collectives.front().first();
  Proposal proposal;
  proposal.signature = {lead.collective,
                        lead.dtype,
                        lead.op,
                        lead.count,
                        static_cast<uint32_t>(unit.collectives.size()),
                        lead.collective == ipc::Collective::kBroadcast ? lead.root : -1,
                        on_device(unit),
                        unit.priority()};
  const ReadyCollective& only = unit.collectives.front();
  const uint64_t eager_max =
      negotiator_ ? negotiator_->agreed_eager_max_bytes() : cost_model::kEagerMinBytes;
  // Empty ones take the network's path, which moves nothing.
  const bool may_piggyback =
      unit.collectives.size() == 1 && !proposal.signature.on_device && only.bytes() > 0;
  if (may_piggyback && lead.collective == ipc::Collective::kAllreduce &&
      only.bytes() <= eager_max) {
    // Small enough to travel with the negotiation: this node's part, reduced over its ranks.
    proposal.piggybacks = true;
    if (negotiator_) proposal.eager = negotiator_->eager_storage();
    proposal.eager.resize(only.bytes());
    AllreduceOperand(only, proposal.eager.data())
        .reduce_into(node_detail::network_op(lead.op), 0, lead.count, nullptr);
  } else if (may_piggyback && ipc::receives_a_block_per_rank(lead.collective) &&
             lead.send_bytes(layout().world_size) * static_cast<uint64_t>(layout().world_size) <=
                 eager_max) {
    // The same for an allgather or an all-to-all whose every send range together is as
    // small: this node's ranks' send ranges, from which every node takes its ranks' blocks by
    // the rank map. Each node takes in every node's part with the cycle, so the limit is on
    // all of them, not on a node's part.
    proposal.piggybacks = true;
    if (negotiator_) proposal.eager = negotiator_->eager_storage();
    pack_send_ranges(only, layout().world_size, proposal.eager);
  } else if (may_piggyback && lead.collective == ipc::Collective::kReduceScatter &&
             lead.send_bytes(layout().world_size) <= eager_max) {
    // And a reduce-scatter whose whole send range is: this node's sums of every block, from
    // which every node takes its ranks' blocks.
    proposal.piggybacks = true;
    if (negotiator_) proposal.eager = negotiator_->eager_storage();
    pack_reduce_scatter_sums(only, layout().world_size, proposal.eager);
  } else if (may_piggyback && lead.collective == ipc::Collective::kBroadcast &&
             only.bytes() <= eager_max) {
    // And a small broadcast: the root's data from its node, an empty contribution from every
    // other node (that takes it this way). The root's node sends no more than a direct
    // broadcast would, and a hop less.
    proposal.piggybacks = true;
    if (const Submission* root = node_detail::root_of(only)) {
      if (negotiator_) proposal.eager = negotiator_->eager_storage();
      proposal.eager.assign(root->send, root->send + only.bytes());
    }
  }
  if (free_units_.empty()) {
    free_units_.push_back(units_.size());
    units_.emplace_back();
    unit_waits_.emplace_back();
  }
  proposal.cookie = free_units_.back();
  free_units_.pop_back();
  unit_waits_[proposal.cookie] = {only.times.ready, false};
  const std::string& key =
      units_[proposal.cookie].emplace(std::move(unit)).collectives.front().first().name;
  if (negotiator_) {
    negotiator_->propose(key, std::move(proposal), more_coming);
  } else {
    proposal.key = key;
    unproposed_.push_back(std::move(proposal));
  }
}

std::optional<NodeJobError> NodeJob::on_message(wire::NodeMessage::Reader message) {
  const uint32_t node = message.getNode();
  if (node >= links_.nodes() || node == links_.me()) {
    return fmt::format("job '{}': a control message claims to be from node {}", links_.job_name(),
                       node);
  }
  try {
    switch (message.which()) {
      case wire::NodeMessage::JOINED:
        on_joined(node, message.getJoined(), message.getIncarnation());
        return form();
      case wire::NodeMessage::CYCLE:
      case wire::NodeMessage::RELAY:
        if (!negotiator_) {
          // A node that formed first has started negotiating: keep it for when we have.
          auto copy = std::make_unique<capnp::MallocMessageBuilder>();
          copy->setRoot(message);
          early_.push_back(std::move(copy));
        } else if (message.isCycle()) {
          negotiator_->on_cycle(node, message.getCycle());
        } else {
          negotiator_->on_relay(node, message.getRelay());
        }
        return std::nullopt;
      case wire::NodeMessage::ABORT:
      case wire::NodeMessage::RANKS_LOST:
        return std::nullopt;  // handled by the engine, which fails jobs
    }
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

void NodeJob::abort_after_agreed(std::string reason, uint64_t last_cycle) {
  if (abort_reason_) return;
  abort_reason_ = std::move(reason);
  abort_after_cycle_ = last_cycle;
  abort_deadline_ = std::chrono::steady_clock::now() + settings().peer_timeout;
}

std::optional<std::string> NodeJob::abort_due() const {
  if (!abort_reason_) return std::nullopt;  // the common case: no clock read
  const bool agreed_left =
      busy() || (negotiator_ && (negotiator_->has_decided() ||
                                 negotiator_->completed_cycle() < abort_after_cycle_));
  // Bounded: whatever the agreed work still waits for, the sender will not be there to give.
  if (agreed_left && std::chrono::steady_clock::now() < abort_deadline_) return std::nullopt;
  return abort_reason_;
}

std::string NodeJob::stall_message(const ReadyUnit& unit,
                                   std::chrono::steady_clock::duration waited) const {
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
                     nodes.empty() ? std::string("the other nodes")
                                   : "node(s) " + nodes + ", which have not submitted it");
}

std::optional<Stall> NodeJob::oldest_stall(std::chrono::steady_clock::time_point now,
                                           std::chrono::steady_clock::duration min_age) const {
  size_t oldest = units_.size();
  for (size_t slot = 0; slot < units_.size(); ++slot) {
    if (!units_[slot] || now - unit_waits_[slot].since < min_age) continue;
    if (oldest == units_.size() || unit_waits_[slot].since < unit_waits_[oldest].since) {
      oldest = slot;
    }
  }
  if (oldest == units_.size()) return std::nullopt;
  const auto waited = now - unit_waits_[oldest].since;
  return Stall{std::chrono::duration<double>(waited).count(),
               stall_message(*units_[oldest], waited)};
}

void NodeJob::warn_stalls(std::chrono::steady_clock::time_point now,
                          std::chrono::steady_clock::duration warn_after,
                          std::vector<std::string>& warn) {
  for (size_t slot = 0; slot < units_.size(); ++slot) {
    UnitWait& wait = unit_waits_[slot];
    if (units_[slot] && now - wait.since >= warn_after && !wait.warned) {
      wait.warned = true;
      warn.push_back(stall_message(*units_[slot], now - wait.since));
    }
  }
}

void NodeJob::broadcast_abort(const std::string& reason) {
  capnp::MallocMessageBuilder message;
  auto root = start_node_message(message, links_.job_name(), links_.me());
  root.setAbort(reason);
  root.setAbortAbandoned(abandoned_);
  root.setAbortAfterCycle(negotiator_ ? negotiator_->completed_cycle() : 0);
  links_.send_control_to_all_live(message, [&](uint32_t node) { stamp(node, message); });
  leave_aggregators(reason);
}

void NodeJob::broadcast_ranks_lost(std::span<const int32_t> ranks, const std::string& reason) {
  capnp::MallocMessageBuilder message;
  auto lost = start_node_message(message, links_.job_name(), links_.me()).initRanksLost();
  auto list = lost.initRanks(static_cast<unsigned>(ranks.size()));
  for (size_t i = 0; i < ranks.size(); ++i) list.set(static_cast<unsigned>(i), ranks[i]);
  lost.setReason(reason);
  links_.send_control_to_all_live(message, [&](uint32_t node) { stamp(node, message); });
}

size_t NodeJob::fail_waiting(gradsync_result status, const std::string& message) {
  failed_ = true;
  probe_.reset();  // its operations retire with it, before what they touch
  // Proposed and undecided counts too: node 0 may have decided it already.
  abandoned_ =
      abandoned_ || busy() || (negotiator_ && negotiator_->has_decided()) ||
      std::any_of(units_.begin(), units_.end(), [](const auto& u) { return u.has_value(); });
  // Unfinished tasks go first: their Flights retire what is still on the wire, with the
  // memory it may touch, before the ranks hear of the failure.
  size_t failed = 0;
  for (auto& work : in_flight_) {
    work->task.reset();
    for (const auto& unit : work->units) failed += complete(unit, status, message);
  }
  in_flight_.clear();
  for (auto& [priority, batches] : queued_) {
    for (auto& batch : batches) {
      for (const auto& unit : batch.units) failed += complete(unit, status, message);
    }
  }
  queued_.clear();
  for (auto& unit : units_) {
    if (unit) failed += complete(*unit, status, message);
  }
  units_.clear();
  free_units_.clear();
  unproposed_.clear();
  return failed;
}

}  // namespace gradsync::daemon
