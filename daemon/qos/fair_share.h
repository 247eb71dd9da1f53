// Weighted fair sharing by bytes between flows (the jobs of one node): start-time fair queueing
// (Goyal, Vin and Cheng, SIGCOMM 1996). A flow's virtual time advances by the bytes it is
// served divided by its weight, and the backlogged flow with the least virtual time goes next.
// Over any stretch in which flows stay backlogged, their bytes follow their weights to within
// one serving each; a flow alone is served all the time (work-conserving). A flow that was idle
// starts again at the current virtual time: being idle earns no credit.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>

namespace gradsync::daemon {

class FairShare {
 public:
  using Flow = uint64_t;

  // Adds the flow, or changes its weight (above 0) from its next serving on.
  void set_weight(Flow flow, double weight);
  void remove(Flow flow) { flows_.erase(flow); }

  // Which of `backlogged` goes next: the least virtual start time, ties to the first listed.
  // A flow not added has weight 1.
  std::optional<Flow> pick(std::span<const Flow> backlogged);
  // `flow` was served `bytes` (after pick chose it).
  void charge(Flow flow, uint64_t bytes);

 private:
  struct State {
    double weight = 1;
    double finish = 0;  // virtual time at which its last serving ended
  };
  std::unordered_map<Flow, State> flows_;
  double now_ = 0;  // the virtual time: the start of the serving last picked
};

}  // namespace gradsync::daemon
