#include "daemon/job/trace.h"

#include <fmt/format.h>

#include <array>

namespace gradsync::daemon {

const char* phase_name(TracePhase phase) {
  static constexpr std::array<const char*, 7> kNames = {
      "negotiate", "queue", "local reduce", "network", "broadcast", "allgather", "alltoall"};
  return kNames[static_cast<size_t>(phase)];
}

TraceRecorder::TraceRecorder(std::string job, Limits limits, std::promise<TraceData> result)
    : limits_(limits), result_(std::move(result)) {
  data_.job = std::move(job);
  data_.started = Clock::now();
}

TraceRecorder::~TraceRecorder() {
  if (!finished_) finish("the job ended");
}

void TraceRecorder::on_ready(const std::string& name) {
  if (finished_) return;
  if (marker_.empty()) {
    marker_ = name;
    return;
  }
  if (name != marker_) return;
  if (++data_.steps >= limits_.steps) finish(fmt::format("{} steps recorded", data_.steps));
}

void TraceRecorder::record(const std::string& name, TracePhase phase, Clock::time_point begin,
                           Clock::time_point end, uint64_t bytes, uint32_t fused) {
  if (finished_) return;
  // Before the recording began (a collective already on its way) is not in the window.
  if (begin < data_.started) begin = data_.started;
  if (end < begin) return;
  auto [it, inserted] = tensor_ids_.try_emplace(name, static_cast<uint32_t>(data_.tensors.size()));
  if (inserted) data_.tensors.push_back(name);
  data_.events.push_back(TraceEvent{it->second, phase, begin, end, bytes, fused});
  if (data_.events.size() >= limits_.max_events) {
    finish(fmt::format("the limit of {} events was reached", limits_.max_events));
  }
}

bool TraceRecorder::check_deadline(Clock::time_point now) {
  if (!finished_ && now >= limits_.deadline) {
    finish(fmt::format("the time limit was reached after {} steps", data_.steps));
  }
  return finished_;
}

void TraceRecorder::finish(std::string why) {
  finished_ = true;
  data_.ended = std::move(why);
  result_.set_value(std::move(data_));
}

}  // namespace gradsync::daemon
