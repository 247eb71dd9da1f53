// A job's bus bandwidth, step by step, the nccl-tests way: bytes times the collective's bus
// factor over time. A step runs from the job's first-seen tensor becoming ready to the next time
// it does (each gradient comes once a step); its time is from its start to its last completion.
// Engine-thread only.
#pragma once

#include "ipc/protocol.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace gradsync::daemon {

// What a collective of `bytes` (payload per rank) moves on the bus among `ranks` ranks: what
// makes the figure comparable across collectives and rank counts (nccl-tests' busbw).
double bus_bytes(ipc::Collective collective, uint64_t bytes, int32_t ranks);

class StepMeter {
 public:
  using Clock = std::chrono::steady_clock;

  // A whole step: what it moved on the bus, and how long it took.
  struct Step {
    double bus_bytes = 0;
    double seconds = 0;
  };
  // Returns the step that ended, when `name` starts the next one.
  std::optional<Step> on_ready(const std::string& name, Clock::time_point now);
  void on_completed(double bus_bytes, Clock::time_point now);
  // Of the last whole step; 0 before one has ended.
  double last_bus_bandwidth() const { return last_; }

 private:
  std::string marker_;
  Clock::time_point step_start_{};
  Clock::time_point last_completion_{};
  double step_bus_bytes_ = 0;
  double last_ = 0;
};

}  // namespace gradsync::daemon
