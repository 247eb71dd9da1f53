#include "daemon/qos/fair_share.h"

#include <algorithm>

namespace gradsync::daemon {

void FairShare::set_weight(Flow flow, double weight) {
  flows_[flow].weight = weight;
}

std::optional<FairShare::Flow> FairShare::pick(std::span<const Flow> backlogged) {
  std::optional<Flow> best;
  double best_start = 0;
  for (const Flow flow : backlogged) {
    const auto it = flows_.find(flow);
    const double start = std::max(now_, it == flows_.end() ? 0 : it->second.finish);
    if (!best || start < best_start) {
      best = flow;
      best_start = start;
    }
  }
  if (best) now_ = best_start;
  return best;
}

void FairShare::charge(Flow flow, uint64_t bytes) {
  State& state = flows_[flow];
  state.finish = std::max(state.finish, now_) + static_cast<double>(bytes) / state.weight;
}

}  // namespace gradsync::daemon
