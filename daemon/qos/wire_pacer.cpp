#include "daemon/qos/wire_pacer.h"

#include <algorithm>
#include <vector>

namespace gradsync::daemon {

void WirePacer::set_share(Flow id, const JobShare& share) {
  FlowState& flow = flows_[id];
  if (flow.share.cap_bytes_per_second != share.cap_bytes_per_second) flow.cap = TokenBucket{};
  flow.share = share;
  fair_.set_weight(id, share.weight);
}

void WirePacer::sample(Clock::time_point now) {
  const double elapsed = std::chrono::duration<double>(now - sampled_at_).count();
  size_t senders = 0;
  for (auto& [id, flow] : flows_) {
    senders += flow.counters.granted_bytes > flow.sampled_bytes;
    flow.sampled_bytes = flow.counters.granted_bytes;
  }
  if (sampled_at_ != Clock::time_point{} && senders >= 2 && !held_below_link_ && elapsed > 0 &&
      (link_rate_sampled_ || ++unpaced_intervals_ >= 2)) {
    const double rate =
        kLinkHeadroom * static_cast<double>(granted_total_ - sampled_total_) / elapsed;
    link_rate_ = link_rate_sampled_ ? std::max(link_rate_, rate) : rate;
    link_rate_sampled_ = true;
  }
  sampled_at_ = now;
  sampled_total_ = granted_total_;
  held_below_link_ = false;
}

void WirePacer::sample_backlog(Clock::time_point now, const transport::SendLoad& load) {
  const auto elapsed = now - backlog_sampled_at_;
  if (backlog_sampled_at_ != Clock::time_point{} && elapsed < kBacklogInterval) return;
  const double seconds = std::chrono::duration<double>(elapsed).count();
  const bool backlogged =
      backlog_sampled_at_ != Clock::time_point{} &&
      load.backlogged_seconds - backlog_sampled_.backlogged_seconds >= kBackloggedPart * seconds;
  const uint64_t delivered = load.delivered_bytes - backlog_sampled_.delivered_bytes;
  // Less than a window delivered behind a backlog is a stall (a peer cut off, a receiver that
  // does not read), not the link's rate; and sends held for one peer may hide a link that
  // carried more than the others sent: a sample lowers the figure by half at most.
  if (backlogged && backlogged_before_ && delivered >= window_bytes_) {
    const double rate = kLinkHeadroom * static_cast<double>(delivered) / seconds;
    link_rate_ = link_rate_sampled_ ? std::max(rate, link_rate_ / 2) : rate;
    link_rate_sampled_ = true;
  }
  backlogged_before_ = backlogged;
  backlog_sampled_at_ = now;
  backlog_sampled_ = load;
}

void WirePacer::remove(Flow id) {
  const auto it = flows_.find(id);
  if (it == flows_.end()) return;
  for (const Ticket ticket : it->second.queue) requests_.erase(ticket);
  flows_.erase(it);
  fair_.remove(id);
}

WirePacer::FlowState& WirePacer::flow_state(Flow id) {
  auto [it, added] = flows_.try_emplace(id);
  if (added) fair_.set_weight(id, it->second.share.weight);
  return it->second;
}

void WirePacer::note_collective(Flow id, Clock::time_point now) {
  flow_state(id).last_collective = now;
}

WirePacer::Ticket WirePacer::request(Flow id, uint64_t bytes, Clock::time_point now) {
  FlowState& flow = flow_state(id);
  if (flow.queue.empty()) flow.waiting_since = now;
  const Ticket ticket = next_ticket_++;
  flow.queue.push_back(ticket);
  requests_.emplace(ticket, Request{id, bytes});
  return ticket;
}

bool WirePacer::TokenBucket::allows(double rate, Clock::time_point now) {
  const double burst = rate * std::chrono::duration<double>(kCapBurst).count();
  if (refilled == Clock::time_point{}) {
    tokens = burst;
  } else if (now > refilled) {
    tokens = std::min(burst, tokens + rate * std::chrono::duration<double>(now - refilled).count());
  }
  refilled = now;
  return tokens >= 0;
}

bool WirePacer::cap_allows(FlowState& flow, Clock::time_point now) {
  return flow.share.cap_bytes_per_second <= 0 ||
         flow.cap.allows(flow.share.cap_bytes_per_second, now);
}

bool WirePacer::active(const FlowState& flow, Clock::time_point now) {
  return !flow.queue.empty() ||
         (flow.last_grant != Clock::time_point{} && now - flow.last_grant < kActiveFor);
}

bool WirePacer::protects_latency(const FlowState& flow, Clock::time_point now) {
  return flow.share.latency_class &&
         (active(flow, now) || (flow.last_collective != Clock::time_point{} &&
                                now - flow.last_collective < kLatencyActiveFor));
}

size_t WirePacer::share_link(Clock::time_point now, bool protect_latency) {
  std::vector<FlowState*> open;  // active flows whose part is not fixed by their cap yet
  for (auto& [id, flow] : flows_) {
    if (active(flow, now)) open.push_back(&flow);
  }
  const size_t active_flows = open.size();
  double rate = link_rate_;
  if (protect_latency) rate *= kLatencyLoad / kLinkHeadroom;
  for (bool capped = true; capped && !open.empty();) {
    capped = false;
    double weights = 0;
    for (const FlowState* flow : open) weights += flow->share.weight;
    for (auto it = open.begin(); it != open.end();) {
      FlowState& flow = **it;
      const double cap = flow.share.cap_bytes_per_second;
      if (cap > 0 && cap < rate * flow.share.weight / weights) {
        flow.part_rate = cap;
        rate -= cap;
        it = open.erase(it);
        capped = true;
      } else {
        flow.part_rate = rate * flow.share.weight / weights;
        ++it;
      }
    }
  }
  return active_flows;
}

void WirePacer::grant(Flow id, FlowState& flow, Clock::time_point now) {
  const Ticket ticket = flow.queue.front();
  flow.queue.pop_front();
  const auto request = requests_.find(ticket);
  const uint64_t bytes = request->second.bytes;
  requests_.erase(request);
  granted_.insert(ticket);
  flow.counters.granted_bytes += bytes;
  granted_total_ += bytes;
  if (flow.share.cap_bytes_per_second > 0) flow.cap.spend(bytes);
  fair_.charge(id, bytes);
  flow.last_grant = now;
  last_grant_ = now;
  if (flow.queue.empty()) {
    flow.counters.waited_seconds += std::chrono::duration<double>(now - flow.waiting_since).count();
  }
}

void WirePacer::dispatch(Clock::time_point now, const transport::SendLoad& load) {
  sample_backlog(now, load);
  if (requests_.empty()) return;
  // A latency-class job's small sends first, past the window.
  for (auto& [id, flow] : flows_) {
    if (!flow.share.latency_class) continue;
    while (!flow.queue.empty() && requests_.at(flow.queue.front()).bytes <= kLatencyClassMaxBytes &&
           cap_allows(flow, now)) {
      grant(id, flow, now);
    }
  }
  uint64_t in_window = load.held_bytes;
  // Shared: every active job within its part of the link. A job alone is never held back.
  // An active latency-class job keeps every other job below the link.
  bool protect_latency = false;
  for (const auto& [id, flow] : flows_)
    protect_latency = protect_latency || protects_latency(flow, now);
  const bool shared = share_link(now, protect_latency) > 1 || protect_latency;
  // The link's figure is not sampled while the jobs are held below it on purpose (once there
  // is one: the first comes from jobs not held at all).
  held_below_link_ = held_below_link_ || (protect_latency && link_rate_sampled_);
  std::vector<Flow> backlogged;
  while (!requests_.empty()) {
    backlogged.clear();
    for (auto& [id, flow] : flows_) {
      if (flow.queue.empty() || !cap_allows(flow, now)) continue;
      if (shared && !part_allows(flow, now)) continue;
      backlogged.push_back(id);
    }
    if (backlogged.empty()) return;
    // Past the window, a job waits for the transport to drain only where others share the
    // link with it. (Checked before the pick, which moves the virtual time on.)
    if (shared && in_window >= window_bytes_ && now - last_grant_ < kStalledWindow) return;
    const Flow id = *fair_.pick(backlogged);
    FlowState& flow = flows_.at(id);
    const uint64_t bytes = requests_.at(flow.queue.front()).bytes;
    in_window += bytes;
    if (shared) flow.part.spend(bytes);
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
