// The running half of NodeJob: what the nodes agreed on, cycle by cycle, becomes batches
// (fused where that pays), which run as tasks the engine resumes, a few at a time.
#include "daemon/collectives/internode/device_staging.h"
#include "daemon/collectives/internode/node_collectives.h"
#include "daemon/collectives/local/device_work.h"
#include "daemon/node/node_job.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace gradsync::daemon {

using Clock = std::chrono::steady_clock;

void NodeJob::trace_completed(const InFlight& work) const {
  const auto done = Clock::now();
  uint32_t fused = 0;
  for (const auto& unit : work.units) fused += static_cast<uint32_t>(unit.collectives.size());
  for (const auto& unit : work.units) {
    for (const auto& c : unit.collectives) {
      const std::string& name = c.first().name;
      const uint64_t bytes = c.bytes();
      trace_->record(name, TracePhase::kNegotiate, c.times.submitted, c.times.agreed, bytes);
      trace_->record(name, TracePhase::kQueue, c.times.agreed, work.started, bytes);
      if (c.first().collective == ipc::Collective::kBarrier) continue;
      trace_->record(name, TracePhase::kNetwork, work.started, done, bytes, fused);
      // Within the network span, where the allreduce reduced and delivered locally.
      const OperandTimes& t = work.times;
      if (t.reduce.end != Clock::time_point{}) {
        trace_->record(name, TracePhase::kLocalReduce, t.reduce.begin, t.reduce.end, bytes, fused);
      }
      if (t.deliver.end != Clock::time_point{}) {
        trace_->record(name, TracePhase::kBroadcast, t.deliver.begin, t.deliver.end, bytes, fused);
      }
    }
  }
}

void NodeJob::count_completed(const ReadyUnit& unit, const char* allreduce_algorithm,
                              bool piggybacked, const cost_model::LinkFigures& link,
                              Clock::time_point now) {
  for (const auto& c : unit.collectives) {
    const ipc::Collective kind = c.first().collective;
    const char* algorithm = "direct";  // allgathers, reduce-scatters, all-to-alls
    if (kind == ipc::Collective::kAllreduce) algorithm = allreduce_algorithm;
    if (kind == ipc::Collective::kBroadcast) {
      // What run_collective chose, from the same figures (a device broadcast staged in pieces
      // chose per piece, and is counted by its whole size).
      algorithm = cost_model::broadcast_algorithm_name(choose_broadcast_for(c.bytes(), link));
    }
    if (kind == ipc::Collective::kBarrier || piggybacked) algorithm = "negotiation";
    metrics_.collective_completed(static_cast<metrics::CollectiveKind>(kind), c.bytes(), algorithm,
                                  std::chrono::duration<double>(now - c.times.ready).count());
    if (steps_ != nullptr) {
      steps_->on_completed(bus_bytes(kind, c.bytes(), layout().world_size), now);
    }
  }
}

void NodeJob::report_negotiation() {
  const Negotiator::Counters& counters = negotiator_->counters();
  const Negotiator::Counters& last = reported_counters_;
  if (counters == last) return;
  metrics_.negotiated({.cache_hits = counters.cache_hits - last.cache_hits,
                       .cache_misses = counters.cache_misses - last.cache_misses,
                       .cycles = counters.cycles - last.cycles,
                       .cycle_messages = counters.cycle_messages - last.cycle_messages});
  reported_counters_ = counters;
}

std::optional<std::string> NodeJob::run_decided(bool& ran) {
  ran = false;
  if (!negotiator_) {
    auto error = finish_forming();
    ran = negotiator_.has_value();
    return error;
  }
  if (!negotiator_->holding()) {
    holding_since_.reset();
  } else if (const auto now = Clock::now(); !holding_since_) {
    holding_since_ = now;
  } else if (now - *holding_since_ >= std::chrono::microseconds(tuned_.negotiation_hold_us)) {
    holding_since_.reset();
    negotiator_->release_hold();
  }
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
  // Node 0's settings hold for what this cycle decided, on every node alike.
  if (cycle.tuned) {
    if (cycle.tuned->settings != from_node_0_) apply_tuned(cycle.tuned->settings);
    if (cycle.tuned->search_done && !node_0_search_done_.value_or(false) && links_.me() != 0) {
      log_->info("job '{}': autotune: node 0 chose {}", links_.job_name(),
                 describe(cycle.tuned->settings));
    }
    node_0_search_done_ = cycle.tuned->search_done;
  }
  // First what needs no network: mismatches, and small allreduces whose data came with the
  // cycle. The negotiator decides only what this node proposed: each has its unit here.
  std::vector<ReadyUnit> networked;
  networked.reserve(cycle.decisions.size());
  NodeResult error;
  const auto agreed = trace_ != nullptr ? Clock::now() : Clock::time_point{};
  Clock::time_point completed{};
  for (const Decision& decision : cycle.decisions) {
    ReadyUnit unit = std::move(*units_[decision.cookie]);
    units_[decision.cookie].reset();
    free_units_.push_back(decision.cookie);
    if (trace_ != nullptr) {
      for (auto& c : unit.collectives) c.times.agreed = agreed;
    }
    if (!decision.error.empty()) {
      complete(unit, GRADSYNC_ERR_MISMATCH, decision.error);
    } else if (const auto contributions = cycle.contributions_of(decision);
               !contributions.empty()) {
      const ReadyCollective& collective = unit.collectives.front();
      NodeResult bad;
      switch (collective.first().collective) {
        case ipc::Collective::kAllgather:
          bad = gather_contributions(collective, rank_nodes_, layout().world_size, contributions);
          break;
        case ipc::Collective::kBroadcast:
          bad = broadcast_contributions(collective, rank_nodes_, contributions);
          break;
        case ipc::Collective::kReduceScatter:
          bad = reduce_scatter_contributions(collective, layout().world_size, contributions);
          break;
        case ipc::Collective::kAllToAll:
          bad = alltoall_contributions(collective, rank_nodes_, layout().world_size, contributions);
          break;
        default:
          bad = reduce_contributions(collective, contributions);
      }
      if (trace_ != nullptr && !bad) {
        // The data came with the negotiation: what is left is the reduce (or the copies).
        const std::string& name = collective.first().name;
        trace_->record(name, TracePhase::kNegotiate, collective.times.submitted, agreed,
                       collective.bytes());
        trace_->record(name, TracePhase::kLocalReduce, agreed, Clock::now(), collective.bytes());
      }
      if (!bad) {
        // One clock read for the cycle's completions: they finish within microseconds.
        if (completed == Clock::time_point{}) completed = Clock::now();
        count_completed(unit, "negotiation", true, cycle.link, completed);
      }
      complete(unit, bad ? GRADSYNC_ERR_PROTOCOL : GRADSYNC_OK, bad.value_or(""));
      recycle(std::move(unit));
      if (!error) error = bad;
    } else {
      networked.push_back(std::move(unit));
    }
  }
  // Then the rest, queued by priority in the agreed order, except that allreduces of one dtype,
  // op and priority that fuse the same way go together where the first of them would have
  // gone. Everything this looks at was agreed on (the decisions, their signatures, the cycle's
  // link figures), so every node queues the same batches in the same order.
  const uint64_t cutoff = cost_model::fusion_cutoff_bytes(cycle.link, links_.nodes());
  std::vector<std::optional<AllreduceOperand::Layout>> layouts(networked.size());
  for (size_t u = 0; u < networked.size(); ++u) {
    layouts[u] = fusion_layout(networked[u], cutoff, cycle.link);
  }
  std::vector<bool> taken(networked.size(), false);
  for (size_t u = 0; u < networked.size(); ++u) {
    if (taken[u]) continue;
    Batch batch{{}, cycle.link, false};
    batch.tuned = tuned_;
    batch.priority = networked[u].priority();
    batch.order = queued_units_ + u;
    batch.units.push_back(std::move(networked[u]));
    const ReadyUnit& first = batch.units.front();
    if (!layouts[u]) {
      queue(std::move(batch));
      continue;
    }
    const auto layout = *layouts[u];
    const Submission& lead = first.collectives.front().first();
    // `first` moves as the batch grows; `lead` lies in its collectives' storage, which does not.
    const bool device = on_device(first);
    uint64_t bytes = first.bytes();
    size_t members = first.collectives.size();
    for (size_t v = u + 1; v < networked.size(); ++v) {
      if (taken[v] || layouts[v] != layout) continue;
      const ReadyUnit& unit = networked[v];
      const Submission& other = unit.collectives.front().first();
      // Device memory and host memory do not share a batch: the one is staged, the other not
      // (whether a unit is on device memory is agreed: it is part of the signature).
      if (other.dtype != lead.dtype || other.op != lead.op || on_device(unit) != device ||
          unit.priority() != batch.priority ||
          bytes + unit.bytes() > tuned_.fusion_threshold_bytes) {
        continue;
      }
      if (layout == AllreduceOperand::Layout::kInPlace &&
          (members + unit.collectives.size() > kMaxInPlaceMembers ||
           choose(bytes + unit.bytes(), lead.dtype, cycle.link, tuned_.ring_min_bytes) !=
               cost_model::AllreduceAlgorithm::kHalvingDoubling)) {
        continue;
      }
      bytes += unit.bytes();
      members += unit.collectives.size();
      batch.units.push_back(std::move(networked[v]));
      taken[v] = true;
    }
    batch.fused = members > 1;
    batch.layout = layout;
    queue(std::move(batch));
  }
  queued_units_ += networked.size();
  return error;
}

void NodeJob::queue(Batch batch) {
  // Each collective's messages carry its numbers, which keep them apart from those of the
  // others in flight; every node numbers the batches as it queues them, in the agreed order.
  batch.first_sequence = next_sequence_;
  if (batch.fused) {
    next_sequence_ += topk_applies(batch.units.front().collectives.front()) ? 2 : 1;
  } else {
    for (const auto& collective : batch.units.front().collectives) {
      next_sequence_ += sequences_of(collective);
    }
  }
  queued_[batch.priority].push_back(std::move(batch));
}

std::optional<AllreduceOperand::Layout> NodeJob::fusion_layout(
    const ReadyUnit& unit, uint64_t cutoff, const cost_model::LinkFigures& link) const {
  const Submission& lead = unit.collectives.front().first();
  const uint64_t bytes = unit.bytes();
  if (bytes > tuned_.fusion_threshold_bytes || unit.collectives.size() > kMaxInPlaceMembers ||
      !std::all_of(unit.collectives.begin(), unit.collectives.end(),
                   [&lead](const ReadyCollective& c) {
                     return c.first().collective == ipc::Collective::kAllreduce &&
                            c.first().dtype == lead.dtype && c.first().op == lead.op;
                   })) {
    return std::nullopt;
  }
  if (bytes < cutoff) return AllreduceOperand::Layout::kPacked;
  // Device memory is staged through one host buffer (device_staging.h): packed, or alone.
  if (on_device(unit)) return std::nullopt;
  if (choose(bytes, lead.dtype, link, tuned_.ring_min_bytes) ==
      cost_model::AllreduceAlgorithm::kHalvingDoubling) {
    return AllreduceOperand::Layout::kInPlace;
  }
  return std::nullopt;
}

std::optional<std::string> NodeJob::progress(bool& ran) {
  // Each completes the moment it is done: the units in flight are independent (a group runs
  // as one task).
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    InFlight& work = **it;
    if (!work.task->poll()) {
      ran |= work.task->worked();  // work of its own, in pieces between rounds (RoundWait)
      ++it;
      continue;
    }
    ran = true;
    NodeResult error = work.task->result();
    if (trace_ != nullptr && !error) trace_completed(work);
    report_aggregation();
    const auto completed = Clock::now();
    for (auto& unit : work.units) {
      if (!error) count_completed(unit, work.allreduce_algorithm, false, work.link, completed);
      complete(unit, error ? GRADSYNC_ERR_PEER_FAILED : GRADSYNC_OK, error.value_or(""));
      recycle(std::move(unit));
    }
    work.units.clear();
    if (error) return error;  // the job fails; fail_waiting completes the rest
    work.task.reset();
    spare_scratch_.push_back(std::move(work.scratch));
    it = in_flight_.erase(it);
    if (agreed_.wire_codec.codec == cost_model::WireCodec::kTopK) report_topk();
  }
  // Start what was agreed: each priority's batches in the agreed order, up to its window,
  // none while another priority's work ranks higher.
  std::optional<Ranked> top;
  for (const auto& work : in_flight_) {
    if (!top || work->ranked.rank > top->rank) top = work->ranked;
  }
  for (auto level = queued_.begin(); level != queued_.end();) {
    auto& [priority, batches] = *level;
    size_t running = 0;
    for (const auto& work : in_flight_) running += work->ranked.priority == priority;
    for (; !batches.empty() && running < kMaxInFlight; ++running) {
      const Ranked next = batches.front().ranked();
      if (top && next.held_back_by(*top)) break;
      if (!top || next.rank > top->rank) top = next;
      Batch batch = std::move(batches.front());
      batches.pop_front();
      start(std::move(batch));
      ran = true;
    }
    level = batches.empty() ? queued_.erase(level) : std::next(level);
  }
  // The bulk sends of the others give way (PaceWait).
  links_.set_top(top);
  return std::nullopt;
}

void NodeJob::start(Batch batch) {
  auto work = std::make_unique<InFlight>();
  work->units = std::move(batch.units);
  work->link = batch.link;
  work->layout = batch.layout;
  work->first_sequence = batch.first_sequence;
  work->ranked = batch.ranked();
  work->tuned = batch.tuned;
  if (spare_scratch_.empty()) {
    work->scratch = std::make_unique<Scratch>();
  } else {
    work->scratch = std::move(spare_scratch_.back());
    spare_scratch_.pop_back();
  }
  if (trace_ != nullptr) work->started = Clock::now();
  InFlight& placed = *work;
  in_flight_.push_back(std::move(work));
  placed.task.emplace(batch.fused ? run_fused(placed) : run_unit(placed));
}

void NodeJob::announce(const TuningAnnouncement& tuned) {
  announced_ = tuned;
  if (negotiator_) negotiator_->announce(tuned);
}

void NodeJob::apply_tuned(const TunedSettings& tuned) {
  from_node_0_ = tuned;
  tuned_ = tuned;
  tuned_.negotiation_hold_us = static_cast<uint32_t>(
      std::min<int64_t>(tuned.negotiation_hold_us, settings_.max_join_hold.count()));
  negotiator_->set_hold_empty_joins(tuned_.negotiation_hold_us > 0);
  log_->debug("job '{}': settings from node 0: {}", links_.job_name(), describe(tuned_));
}

void NodeJob::publish_own_link() {
  if (links_.nodes() < 2) return;
  const uint32_t left = (links_.me() + links_.nodes() - 1) % links_.nodes();
  const double bytes_per_second =
      own_link_.beta_seconds_per_byte > 0 ? 1 / own_link_.beta_seconds_per_byte : 0;
  metrics_.peer_link_measured(layout().nodes[left], own_link_.alpha_seconds, bytes_per_second);
  links_.set_link(left, own_link_.alpha_seconds, bytes_per_second);
}

void NodeJob::refine_beta(cost_model::AllreduceAlgorithm algorithm, uint64_t bytes,
                          cost_model::WireCodec codec,
                          std::chrono::steady_clock::time_point started) {
  // Through aggregators, the aggregators' links share the time: it says less of the nodes'.
  if (bytes < cost_model::kRefineBetaMinBytes || links_.nodes() < 2 ||
      algorithm == cost_model::AllreduceAlgorithm::kAggregate ||
      algorithm == cost_model::AllreduceAlgorithm::kSplit) {
    return;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const auto beta =
      cost_model::implied_beta(algorithm, own_link_, links_.nodes(), bytes, codec, seconds);
  if (!beta || (own_link_.beta_seconds_per_byte > 0 && *beta >= own_link_.beta_seconds_per_byte))
    return;
  own_link_.beta_seconds_per_byte = *beta;
  // Every node adopts the agreed figures a cycle at a time, from what each node sent with it,
  // so a node changing its own between cycles keeps every node's choices alike.
  negotiator_->set_own_link(own_link_);
  publish_own_link();
  log_->debug("job '{}': {} bytes by {} in {:.3f} ms: beta now {:.3f} GB/s", links_.job_name(),
              bytes, cost_model::algorithm_name(algorithm), seconds * 1e3, 1e-9 / *beta);
}

bool NodeJob::topk_applies(const ReadyCollective& collective) const {
  const Submission& lead = collective.first();
  return agreed_.wire_codec.codec == cost_model::WireCodec::kTopK && links_.nodes() > 1 &&
         lead.collective == ipc::Collective::kAllreduce && lead.dtype == GRADSYNC_FLOAT32 &&
         (lead.op == GRADSYNC_SUM || lead.op == GRADSYNC_AVG) &&
         staging_pieces(collective).count == 1;
}

uint64_t NodeJob::sequences_of(const ReadyCollective& collective) const {
  return topk_applies(collective) ? 2 : staging_pieces(collective).count;
}

TopKRun NodeJob::topk_run(const InFlight& work) {
  return TopKRun{agreed_.wire_codec.topk_percent, residuals_,
                 [this, link = work.link, ring_min = work.tuned.ring_min_bytes](uint64_t bytes) {
                   return choose(bytes, GRADSYNC_FLOAT32, link, ring_min);
                 }};
}

void NodeJob::report_topk() {
  const uint64_t held = residuals_.bytes();
  const uint64_t evicted = residuals_.evicted();
  if (held == reported_held_bytes_ && evicted == reported_evicted_) return;
  metrics_.topk_held(static_cast<int64_t>(held) - static_cast<int64_t>(reported_held_bytes_),
                     evicted - reported_evicted_);
  reported_held_bytes_ = held;
  reported_evicted_ = evicted;
}

cost_model::WireCodec NodeJob::codec_for(gradsync_dtype dtype) const {
  // Only f32 has bytes to spare that bf16 keeps the range of.
  return dtype == GRADSYNC_FLOAT32 ? agreed_.wire_codec.codec : cost_model::WireCodec::kNone;
}

cost_model::AllreduceAlgorithm NodeJob::choose(uint64_t bytes, gradsync_dtype dtype,
                                               const cost_model::LinkFigures& link,
                                               uint64_t ring_min_bytes) const {
  if (links_.nodes() == 1)
    return cost_model::AllreduceAlgorithm::kHalvingDoubling;  // the local reduce
  if (const auto forced = cost_model::parse_algorithm(agreed_.algorithm)) return *forced;
  if (ring_min_bytes > 0) {
    return bytes >= ring_min_bytes ? cost_model::AllreduceAlgorithm::kRing
                                   : cost_model::AllreduceAlgorithm::kHalvingDoubling;
  }
  return cost_model::choose_allreduce(link, links_.nodes(), bytes, codec_for(dtype),
                                      aggregator_figures(link));
}

cost_model::AggregatorFigures NodeJob::aggregator_figures(
    const cost_model::LinkFigures& link) const {
  const double bytes_per_second = settings_.aggregator_bytes_per_second;
  return {links_.aggregators(),
          bytes_per_second > 0 ? 1 / bytes_per_second : link.beta_seconds_per_byte};
}

cost_model::BroadcastAlgorithm NodeJob::choose_broadcast_for(
    uint64_t bytes, const cost_model::LinkFigures& link) const {
  // A forced algorithm names the family: bandwidth-optimal (the ring, the chain) or
  // latency-optimal (halving-doubling, the direct broadcast's one step).
  if (const auto forced = cost_model::parse_algorithm(agreed_.algorithm)) {
    return *forced == cost_model::AllreduceAlgorithm::kRing
               ? cost_model::BroadcastAlgorithm::kChain
               : cost_model::BroadcastAlgorithm::kDirect;
  }
  return cost_model::choose_broadcast(link, links_.nodes(), bytes);
}

CollectiveContext NodeJob::step_for(InFlight& work, uint32_t sequence, gradsync_dtype dtype) {
  const bool cut = agreed_.slow_link_message_bytes > 0 && cost_model::eager_bulk_pays(work.link);
  if (cut != cutting_messages_) {
    cutting_messages_ = cut;
    const cost_model::LinkFigures& link = work.link;
    log_->info("job '{}': wire {:.3f} GB/s, reduce {:.2f} GB/s: bulk data goes {}",
               links_.job_name(),
               link.beta_seconds_per_byte > 0 ? 1e-9 / link.beta_seconds_per_byte : 0.0,
               link.gamma_seconds_per_byte > 0 ? 1e-9 / link.gamma_seconds_per_byte : 0.0,
               cut ? fmt::format("eagerly, in messages of {} bytes (the link is slow)",
                                 agreed_.slow_link_message_bytes)
                   : std::string("as UCX chooses again"));
  }
  return CollectiveContext{
      links_,
      *work.scratch,
      sequence,
      layout().world_size,
      codec_for(dtype),
      cut ? agreed_.slow_link_message_bytes : 0,
      work.ranked,
      work.tuned.piece_bytes,
      agreed_.aggregation_chunk_bytes,
      cost_model::aggregated_share(links_.nodes(), work.link, aggregator_figures(work.link))};
}

NodeTask NodeJob::run_unit(InFlight& work) {
  const ReadyUnit& unit = work.units.front();
  auto sequence = static_cast<uint32_t>(work.first_sequence);
  for (const ReadyCollective& collective : unit.collectives) {
    NodeTask task = collective.first().device == kHostMemory
                        ? run_collective(work, collective, sequence, topk_applies(collective))
                        : run_staged(work, collective, sequence);
    sequence += static_cast<uint32_t>(sequences_of(collective));
    if (auto error = co_await finish(task)) co_return error;
  }
  co_return std::nullopt;
}

NodeTask NodeJob::run_staged(InFlight& work, const ReadyCollective& collective, uint32_t sequence) {
  std::optional<DeviceStage> stage;
  try {
    stage.emplace(std::vector<const ReadyCollective*>{&collective}, device_streams_,
                  layout().world_size);
  } catch (const DeviceError& e) {
    co_return fmt::format("job '{}': '{}' could not be staged: {}", links_.job_name(),
                          collective.first().name, e.what());
  }
  (void)co_await stage->ranks_written();
  const StagingPieces pieces = staging_pieces(collective);
  if (pieces.count == 1) {
    if (auto error = co_await stage->to_host()) co_return error;
    NodeTask task = run_collective(work, stage->host(), sequence, topk_applies(collective));
    if (auto error = co_await finish(task)) co_return error;
    co_return co_await stage->to_devices();
  }
  // In pieces: every piece's copy to host memory is enqueued at once (the streams run them in
  // order), each piece crosses the network once its copy is in, and goes back to the devices
  // while the next one crosses.
  const uint64_t count = collective.first().count;
  std::vector<NodeAwait<FenceWait>> in;
  std::vector<NodeAwait<FenceWait>> out;
  in.reserve(pieces.count);
  out.reserve(pieces.count);
  for (uint64_t p = 0; p < pieces.count; ++p) {
    in.push_back(stage->to_host(p * pieces.elements, std::min(count, (p + 1) * pieces.elements)));
  }
  for (uint64_t p = 0; p < pieces.count; ++p) {
    const uint64_t begin = p * pieces.elements;
    const uint64_t end = std::min(count, begin + pieces.elements);
    if (auto error = co_await in[p]) co_return error;
    const ReadyCollective piece = stage->piece(begin, end);
    NodeTask task = run_collective(work, piece, sequence + static_cast<uint32_t>(p), false);
    if (auto error = co_await finish(task)) co_return error;
    out.push_back(stage->to_devices(begin, end));
  }
  for (auto& back : out) {
    if (auto error = co_await back) co_return error;
  }
  co_return std::nullopt;
}

NodeTask NodeJob::run_collective(InFlight& work, const ReadyCollective& collective,
                                 uint32_t sequence, bool topk) {
  CollectiveContext step = step_for(work, sequence, collective.first().dtype);
  switch (collective.first().collective) {
    case ipc::Collective::kAllreduce: {
      AllreduceOperand operand(collective);
      if (trace_ != nullptr) operand.time_into(&work.times);
      if (topk) {
        metrics_.internode_allreduce("topk");
        work.allreduce_algorithm = "topk";
        NodeTask task = node_topk_allreduce(step, operand, topk_run(work));
        co_return co_await finish(task);
      }
      const cost_model::AllreduceAlgorithm algorithm = choose(
          collective.bytes(), collective.first().dtype, work.link, work.tuned.ring_min_bytes);
      metrics_.internode_allreduce(cost_model::algorithm_name(algorithm));
      work.allreduce_algorithm = cost_model::algorithm_name(algorithm);
      log_->debug("job '{}': allreduce '{}' ({} bytes) as collective {} by {}", links_.job_name(),
                  collective.first().name, collective.bytes(), step.sequence,
                  cost_model::algorithm_name(algorithm));
      const auto started = std::chrono::steady_clock::now();
      NodeTask task = run_allreduce(step, operand, algorithm);
      if (auto error = co_await finish(task)) co_return error;
      refine_beta(algorithm, collective.bytes(), step.codec, started);
      co_return std::nullopt;
    }
    case ipc::Collective::kBroadcast: {
      const cost_model::BroadcastAlgorithm algorithm =
          choose_broadcast_for(collective.bytes(), work.link);
      log_->debug("job '{}': broadcast '{}' ({} bytes) as collective {} by {}", links_.job_name(),
                  collective.first().name, collective.bytes(), step.sequence,
                  cost_model::broadcast_algorithm_name(algorithm));
      NodeTask task =
          run_broadcast(step, collective, rank_nodes_.node_of(collective.first().root), algorithm);
      co_return co_await finish(task);
    }
    case ipc::Collective::kAllgather: {
      NodeTask task = node_allgather(step, collective);
      co_return co_await finish(task);
    }
    case ipc::Collective::kReduceScatter: {
      NodeTask task = node_reduce_scatter(step, collective, rank_nodes_);
      co_return co_await finish(task);
    }
    case ipc::Collective::kAllToAll: {
      NodeTask task = node_alltoall(step, collective, rank_nodes_);
      co_return co_await finish(task);
    }
    case ipc::Collective::kBarrier:
      break;  // agreement among the nodes is the barrier
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
  const gradsync_dtype dtype = fused.front()->first().dtype;
  const cost_model::AllreduceAlgorithm algorithm =
      choose(bytes, dtype, work.link, work.tuned.ring_min_bytes);
  const bool topk = topk_applies(*fused.front());
  const bool on_device = fused.front()->first().device != kHostMemory;
  // In place only where halving-doubling runs it (take_cycle makes sure it does): the ring
  // needs the work in one block. Top-k packs what it sends itself: host members stay in place.
  AllreduceOperand::Layout members_layout = AllreduceOperand::Layout::kPacked;
  if (topk && !on_device) {
    members_layout = AllreduceOperand::Layout::kInPlace;
  } else if (!topk && algorithm == cost_model::AllreduceAlgorithm::kHalvingDoubling) {
    members_layout = work.layout;
  }
  const bool in_place = members_layout == AllreduceOperand::Layout::kInPlace;
  // On device memory (always packed): each member reduced on the devices into its place in one
  // pinned host buffer, which the batch then runs in.
  std::optional<DeviceStage> stage;
  if (on_device) {
    try {
      stage.emplace(fused, device_streams_, layout().world_size);
    } catch (const DeviceError& e) {
      co_return fmt::format("job '{}': {} fused tensors could not be staged: {}", links_.job_name(),
                            fused.size(), e.what());
    }
    (void)co_await stage->ranks_written();
    if (auto error = co_await stage->to_host()) co_return error;
    fused = stage->hosts();
  }
  uint8_t* packed = stage      ? stage->buffer()
                    : in_place ? nullptr
                               : work.scratch->get(kFusionScratchSlot, bytes);
  AllreduceOperand operand(fused, packed, members_layout);
  if (trace_ != nullptr) operand.time_into(&work.times);
  CollectiveContext step = step_for(work, static_cast<uint32_t>(work.first_sequence), dtype);
  const char* by = topk ? "topk" : cost_model::algorithm_name(algorithm);
  metrics_.internode_allreduce(by);
  work.allreduce_algorithm = by;
  log_->debug("job '{}': {} tensors fused ({} bytes, {}) as collective {} by {}", links_.job_name(),
              fused.size(), bytes, in_place ? "in place" : "packed", step.sequence, by);
  const auto network_started = std::chrono::steady_clock::now();
  NodeTask task = topk ? node_topk_allreduce(step, operand, topk_run(work))
                       : run_allreduce(step, operand, algorithm);
  NodeResult error = co_await finish(task);
  // Top-k's wire bytes are not the batch's: its time says nothing of β.
  if (!error && !topk) refine_beta(algorithm, bytes, step.codec, network_started);
  if (!error && stage) error = co_await stage->to_devices();
  metrics_.batch_executed(
      bytes, fused.size(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
      static_cast<double>(bytes) / static_cast<double>(work.tuned.fusion_threshold_bytes));
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

size_t NodeJob::scratch_bytes() const {
  size_t bytes = scratch_.bytes();
  for (const auto& work : in_flight_) bytes += work->scratch ? work->scratch->bytes() : 0;
  for (const auto& spare : spare_scratch_) bytes += spare->bytes();
  return bytes;
}

void NodeJob::release_unused_scratch(std::chrono::steady_clock::time_point unused_since) {
  if (!measuring()) scratch_.release_unused(unused_since);
  for (const auto& spare : spare_scratch_) spare->release_unused(unused_since);
}

}  // namespace gradsync::daemon
