#include "daemon/job/step_meter.h"

namespace gradsync::daemon {

double bus_bytes(ipc::Collective collective, uint64_t bytes, int32_t ranks) {
  const double n = ranks;
  const auto b = static_cast<double>(bytes);
  switch (collective) {
    case ipc::Collective::kAllreduce:
      return b * 2 * (n - 1) / n;
    // Each rank's n blocks received (allgather), sent (reduce-scatter) or both (all-to-all),
    // (n - 1)/n of them from or to the others.
    case ipc::Collective::kAllgather:
    case ipc::Collective::kReduceScatter:
    case ipc::Collective::kAllToAll:
      return b * (n - 1);
    case ipc::Collective::kBroadcast:
      return b;
    case ipc::Collective::kBarrier:
      return 0;
  }
  return 0;
}

std::optional<StepMeter::Step> StepMeter::on_ready(const std::string& name, Clock::time_point now) {
  if (marker_.empty()) marker_ = name;
  if (name != marker_) return std::nullopt;
  std::optional<Step> ended;
  if (step_start_ != Clock::time_point{} && last_completion_ > step_start_) {
    ended = Step{step_bus_bytes_,
                 std::chrono::duration<double>(last_completion_ - step_start_).count()};
    last_ = ended->bus_bytes / ended->seconds;
  }
  step_start_ = now;
  step_bus_bytes_ = 0;
  return ended;
}

void StepMeter::on_completed(double bus_bytes, Clock::time_point now) {
  step_bus_bytes_ += bus_bytes;
  last_completion_ = now;
}

}  // namespace gradsync::daemon
