#include "daemon/qos/wire_pacer.h"

#include <algorithm>
#include <vector>

namespace gradsync::daemon {

void WirePacer::set_share(Flow id, const JobShare& share) {
  auto [it, added] = flows_.try_emplace(id);
  FlowState& flow = it->second;
  if (added || flow.share.cap_bytes_per_second != share.cap_bytes_per_second) {
    flow.tokens = share.cap_bytes_per_second * std::chrono::duration<double>(kCapBurst).count();
    flow.refilled = Clock::time_point{};  // refilled from the next look on
  }
  flow.share = share;
  fair_.set_weight(id, share.weight);
}

void WirePacer::remove(Flow id) {
  const auto it = flows_.find(id);
  if (it == flows_.end()) return;
  for (const Ticket ticket : it->second.queue) requests_.erase(ticket);
  flows_.erase(it);
  fair_.remove(id);
}

WirePacer::Ticket WirePacer::request(Flow id, uint64_t bytes, Clock::time_point now) {
  auto [it, added] = flows_.try_emplace(id);
  if (added) fair_.set_weight(id, it->second.share.weight);
  FlowState& flow = it->second;
  if (flow.queue.empty()) flow.waiting_since = now;
  const Ticket ticket = next_ticket_++;
  flow.queue.push_back(ticket);
  requests_.emplace(ticket, Request{id, bytes});
  return ticket;
}

void WirePacer::refill(FlowState& flow, Clock::time_point now) const {
  const double cap = flow.share.cap_bytes_per_second;
  const double burst = cap * std::chrono::duration<double>(kCapBurst).count();
  if (flow.refilled != Clock::time_point{} && now > flow.refilled) {
    flow.tokens += cap * std::chrono::duration<double>(now - flow.refilled).count();
  }
  flow.tokens = std::min(flow.tokens, burst);
  flow.refilled = now;
}

bool WirePacer::cap_allows(FlowState& flow, Clock::time_point now) const {
  if (flow.share.cap_bytes_per_second <= 0) return true;
  refill(flow, now);
  return flow.tokens >= 0;
}

bool WirePacer::contended(Flow id, Clock::time_point now) const {
  for (const auto& [other, flow] : flows_) {
    if (other == id) continue;
    if (!flow.queue.empty()) return true;
    if (flow.last_grant != Clock::time_point{} && now - flow.last_grant < kActiveFor) return true;
  }
  return false;
}

void WirePacer::grant(Flow id, FlowState& flow, Clock::time_point now) {
  const Ticket ticket = flow.queue.front();
  flow.queue.pop_front();
  const auto request = requests_.find(ticket);
  const uint64_t bytes = request->second.bytes;
  requests_.erase(request);
  granted_.insert(ticket);
  flow.counters.granted_bytes += bytes;
  if (flow.share.cap_bytes_per_second > 0) flow.tokens -= static_cast<double>(bytes);
  fair_.charge(id, bytes);
  flow.last_grant = now;
  last_grant_ = now;
  if (flow.queue.empty()) {
    flow.counters.waited_seconds += std::chrono::duration<double>(now - flow.waiting_since).count();
  }
}

void WirePacer::dispatch(Clock::time_point now, uint64_t held_bytes) {
  if (requests_.empty()) return;
  // A latency-class job's small sends first, past the window.
  for (auto& [id, flow] : flows_) {
    if (!flow.share.latency_class) continue;
    while (!flow.queue.empty() && requests_.at(flow.queue.front()).bytes <= kLatencyClassMaxBytes &&
           cap_allows(flow, now)) {
      grant(id, flow, now);
    }
  }
  uint64_t in_window = held_bytes;
  std::vector<Flow> backlogged;
  while (!requests_.empty()) {
    backlogged.clear();
    for (auto& [id, flow] : flows_) {
      if (!flow.queue.empty() && cap_allows(flow, now)) backlogged.push_back(id);
    }
    if (backlogged.empty()) return;
    const Flow id = *fair_.pick(backlogged);
    // Past the window, a job waits for the transport to drain only where others share the
    // link with it: alone, it is granted at once.
    if (in_window >= window_bytes_ && contended(id, now) && now - last_grant_ < kStalledWindow) {
      return;
    }
    FlowState& flow = flows_.at(id);
    in_window += requests_.at(flow.queue.front()).bytes;
    grant(id, flow, now);
  }
}

bool WirePacer::take_grant(Ticket ticket) {
  return granted_.erase(ticket) > 0;
}

void WirePacer::cancel(Ticket ticket) {
  if (granted_.erase(ticket) > 0) return;
  const auto request = requests_.find(ticket);
  if (request == requests_.end()) return;
  const auto flow = flows_.find(request->second.flow);
  requests_.erase(request);
  if (flow == flows_.end()) return;
  FlowState& state = flow->second;
  std::erase(state.queue, ticket);
  if (state.queue.empty()) {
    state.counters.waited_seconds +=
        std::chrono::duration<double>(Clock::now() - state.waiting_since).count();
  }
}

WirePacer::FlowCounters WirePacer::counters(Flow id, Clock::time_point now) const {
  const auto it = flows_.find(id);
  if (it == flows_.end()) return {};
  FlowCounters counters = it->second.counters;
  if (!it->second.queue.empty()) {
    counters.waited_seconds +=
        std::chrono::duration<double>(now - it->second.waiting_since).count();
  }
  return counters;
}

}  // namespace gradsync::daemon
