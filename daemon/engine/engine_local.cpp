// Shares between jobs on the engine (docs/qos.md): the host work of single-node jobs runs a
// piece at a time, the job whose turn it is first, and within a job the work of highest
// priority first (docs/priority.md); and every job is placed in the pacer of sends to other
// nodes with the share its rule gives it.
#include "daemon/engine/engine.h"

#include "daemon/collectives/local/device_work.h"
#include "daemon/node/node_job.h"
#include "daemon/qos/priority.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// After this long running pieces, the engine goes round (takes new submissions, moves the
// network) before the next: a latency-class job's collective submitted meanwhile goes next.
constexpr auto kLocalRound = std::chrono::microseconds(500);

// A batch that ran on this node alone: each collective negotiated, queued, then ran with the
// rest of the batch.
void trace_local_batch(TraceRecorder& trace, const std::vector<ReadyUnit>& batch,
                       Clock::time_point start, Clock::time_point end) {
  uint32_t fused = 0;
  for (const auto& unit : batch) fused += static_cast<uint32_t>(unit.collectives.size());
  for (const auto& unit : batch) {
    for (const auto& c : unit.collectives) {
      const Submission& lead = c.first();
      trace.record(lead.name, TracePhase::kNegotiate, c.times.submitted, c.times.ready, c.bytes());
      trace.record(lead.name, TracePhase::kQueue, c.times.ready, start, c.bytes());
      TracePhase phase = TracePhase::kLocalReduce;
      if (lead.collective == ipc::Collective::kBroadcast) phase = TracePhase::kBroadcast;
      if (lead.collective == ipc::Collective::kAllgather) phase = TracePhase::kAllgather;
      if (lead.collective == ipc::Collective::kAllToAll) phase = TracePhase::kAllToAll;
      if (lead.collective != ipc::Collective::kBarrier) {
        trace.record(lead.name, phase, start, end, c.bytes(), fused);
      }
    }
  }
}

std::string describe(const JobShare& share) {
  std::string text = fmt::format("weight {}", share.weight);
  if (share.cap_bytes_per_second > 0) {
    text += fmt::format(", capped at {} Gbit/s", share.cap_bytes_per_second * 8 / 1e9);
  }
  if (share.latency_class) text += ", latency class";
  return share.rule > 0 ? fmt::format("{} (qos.rule[{}])", text, share.rule)
                        : text + " (no rule matches)";
}

}  // namespace

bool Engine::run_local_work() {
  bool any = false;
  const auto round_start = Clock::now();
  std::vector<Job*> backlogged;
  std::vector<LocalTurn> turns;
  std::vector<FairShare::Flow> flows;
  for (;;) {
    backlogged.clear();
    turns.clear();
    flows.clear();
    size_t urgent = LocalTurn::kNone;  // a latency-class job's small collective goes first
    for (auto& [name, job] : jobs_) {
      if (job->network() != nullptr) continue;
      const LocalTurn turn = next_local_turn(*job);
      if (turn.bytes == 0) continue;
      if (urgent == LocalTurn::kNone && job->qos().share.latency_class &&
          turn.bytes <= kLatencyClassMaxBytes) {
        urgent = backlogged.size();
      }
      backlogged.push_back(job.get());
      turns.push_back(turn);
      flows.push_back(job->qos().flow);
    }
    if (backlogged.empty()) break;
    size_t next = urgent;
    if (next == LocalTurn::kNone) {
      const FairShare::Flow flow = *engine_share_.pick(flows);
      next = static_cast<size_t>(std::find(flows.begin(), flows.end(), flow) - flows.begin());
    }
    Job& job = *backlogged[next];
    backlogged.erase(backlogged.begin() + static_cast<std::ptrdiff_t>(next));
    serve_local_piece(job, turns[next], backlogged);
    any = true;
    if (Clock::now() - round_start >= kLocalRound) break;
  }
  return any;
}

Engine::LocalTurn Engine::next_local_turn(Job& job) const {
  LocalTurn turn;
  int64_t best = std::numeric_limits<int64_t>::min();
  size_t running_count = 0;
  // Ties go to the batch running (the first started), then to the unit ready first.
  if (const auto running = running_batches_.find(job.qos().flow);
      running != running_batches_.end()) {
    running_count = running->second.size();
    for (size_t b = 0; b < running_count; ++b) {
      const RunningBatch& batch = running->second[b];
      const int64_t rank = priority_rank(batch.priority, batch.order);
      if (rank > best) {
        best = rank;
        turn = {b, LocalTurn::kNone, batch.batch.left()};
      }
    }
  }
  if (running_count >= kMaxRunningBatches) return turn;
  // A device unit runs on the daemon's streams once the host work ahead of it is done: the
  // units after it wait for it, in order.
  const auto& ready = job.ready();
  for (size_t u = 0; u < ready.size() && !on_device(ready[u]); ++u) {
    const int64_t rank = priority_rank(ready[u].priority(), ready[u].order);
    if (rank > best) {
      best = rank;
      turn = {LocalTurn::kNone, u, std::max<uint64_t>(ready[u].bytes(), 1)};
    }
  }
  return turn;
}

void Engine::serve_local_piece(Job& job, const LocalTurn& turn, std::span<Job* const> waiting) {
  const uint64_t flow = job.qos().flow;
  std::vector<RunningBatch>& running = running_batches_[flow];
  const auto start = Clock::now();
  size_t index = turn.running;
  // Autotune's where it tunes the job, else the configuration's.
  const TunedSettings* tuned = job.tuned();
  const uint64_t fusion_threshold =
      tuned != nullptr ? tuned->fusion_threshold_bytes : config_.fusion_threshold_bytes;
  if (index == LocalTurn::kNone) {
    // Lazy fusion: the unit, then the ready units after it of its priority, up to the
    // threshold; a group is never split, and a unit larger than the threshold runs alone.
    // Device units are not fused in.
    auto& ready = job.ready();
    const int32_t priority = ready[turn.ready].priority();
    const uint64_t order = ready[turn.ready].order;
    std::vector<ReadyUnit> units;
    uint64_t bytes = 0;
    for (size_t u = turn.ready; u < ready.size() && !on_device(ready[u]);) {
      if (!units.empty() && ready[u].priority() != priority) {
        ++u;
        continue;
      }
      if (!units.empty() && bytes + ready[u].bytes() > fusion_threshold) break;
      bytes += ready[u].bytes();
      units.push_back(std::move(ready[u]));
      ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(u));
    }
    running.push_back(RunningBatch{LocalBatch(std::move(units)), priority, order, start});
    index = running.size() - 1;
  }
  RunningBatch& current = running[index];
  const uint64_t before = current.batch.left();
  current.batch.run(tuned != nullptr ? tuned->piece_bytes : config_.pipeline_piece_bytes, pool_,
                    config_.parallel_reduce_min_bytes);
  const auto end = Clock::now();
  const uint64_t ran = before - current.batch.left();
  const double seconds = std::chrono::duration<double>(end - start).count();
  current.seconds += seconds;
  engine_share_.charge(flow, std::max<uint64_t>(ran, 1));
  job.qos().engine_bytes += ran;
  for (Job* other : waiting) other->qos().engine_wait_seconds += seconds;
  if (!current.batch.finished()) return;

  current.batch.complete();
  std::vector<ReadyUnit>& batch = current.batch.units();
  uint64_t collectives = 0;
  uint64_t unit_bytes = 0;
  for (const auto& unit : batch) {
    collectives += record_local_completion(job, unit, end);
    unit_bytes += unit.bytes();
  }
  metrics_.batch_executed(current.batch.bytes(), collectives, current.seconds,
                          static_cast<double>(unit_bytes) / static_cast<double>(fusion_threshold));
  if (TraceRecorder* trace = job.trace()) trace_local_batch(*trace, batch, current.start, end);
  for (ReadyUnit& unit : batch) job.unit_pool().recycle(std::move(unit));
  running.erase(running.begin() + static_cast<std::ptrdiff_t>(index));
  if (running.empty()) running_batches_.erase(flow);
}

void Engine::finish_local_batch(Job& job) {
  const uint64_t flow = job.qos().flow;
  while (running_batches_.contains(flow)) {
    serve_local_piece(job, LocalTurn{0, LocalTurn::kNone, 1}, {});
  }
}

void Engine::apply_share(Job& job) {
  Job::Qos& qos = job.qos();
  const JobShare share = share_for(config_.qos_rules, job.name(), qos.owner);
  const bool placed = qos.flow != 0;
  if (placed && share == qos.share) return;
  if (!placed) qos.flow = next_flow_++;
  if (placed || share.rule > 0) {
    log_->info("job '{}': {}", job.name(), describe(share));
  }
  qos.share = share;
  engine_share_.set_weight(qos.flow, share.weight);
  wire_pacer_.set_share(qos.flow, share);
  if (NodeJob* network = job.network()) network->set_pacer(&wire_pacer_, qos.flow);
}

void Engine::handle(Reconfigure& command) {
  config_ = std::move(command.config);
  for (auto& [name, job] : jobs_) apply_share(*job);
}

void Engine::sample_shares() {
  const auto now = Clock::now();
  // The interval's bytes: the live jobs' since the last sample.
  uint64_t interval = 0;
  for (const auto& [name, job] : jobs_) {
    interval +=
        wire_pacer_.counters(job->qos().flow, now).granted_bytes - job->qos().reported_wire_bytes;
  }
  for (auto& [name, job] : jobs_) {
    Job::Qos& qos = job->qos();
    const uint64_t granted = wire_pacer_.counters(qos.flow, now).granted_bytes;
    qos.wire_share = interval == 0 ? 0
                                   : static_cast<double>(granted - qos.reported_wire_bytes) /
                                         static_cast<double>(interval);
    qos.reported_wire_bytes = granted;
  }
}

}  // namespace gradsync::daemon
