// A bounded recording of one job's per-tensor events on this node, for `gradsyncctl trace`.
// Off unless asked for: a job without a recorder pays one branch per collective. Engine-thread
// only; the finished recording goes to the control thread through a promise, which renders it
// (admin.h) so that the engine spends no time on text.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gradsync::daemon {

// What a tensor was doing: waiting for its ranks (and nodes) to agree, waiting for its turn,
// and the parts of running it. Across nodes, local reduce and broadcast fall inside network:
// the pipelined algorithms reduce and deliver pieces while others travel.
enum class TracePhase : uint8_t {
  kNegotiate,
  kQueue,
  kLocalReduce,
  kNetwork,
  kBroadcast,
  kAllgather,
  kAllToAll,
};
const char* phase_name(TracePhase phase);

struct TraceEvent {
  uint32_t tensor;  // index into TraceData::tensors
  TracePhase phase;
  std::chrono::steady_clock::time_point begin;
  std::chrono::steady_clock::time_point end;
  uint64_t bytes;
  uint32_t fused;  // tensors that ran together with it, itself included
};

struct TraceData {
  std::string job;
  std::string error;  // non-empty: nothing was recorded, and why
  std::string ended;  // why the recording stopped
  uint32_t steps = 0;
  std::chrono::steady_clock::time_point started;
  std::vector<std::string> tensors;
  std::vector<TraceEvent> events;
};

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    uint32_t steps = 1;
    uint32_t max_events = 1;
    Clock::time_point deadline;
  };

  TraceRecorder(std::string job, Limits limits, std::promise<TraceData> result);
  ~TraceRecorder();  // hands over what was recorded, if not done already
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // A tensor became ready on this node (every local rank submitted it). The first one recorded
  // marks the steps: when it comes again, a step has ended.
  void on_ready(const std::string& name);
  void record(const std::string& name, TracePhase phase, Clock::time_point begin,
              Clock::time_point end, uint64_t bytes, uint32_t fused = 1);
  // Ends the recording at the deadline; true once it has ended (for whatever reason).
  bool check_deadline(Clock::time_point now);
  bool finished() const { return finished_; }

 private:
  void finish(std::string why);

  Limits limits_;
  TraceData data_;
  std::promise<TraceData> result_;
  std::unordered_map<std::string, uint32_t> tensor_ids_;
  std::string marker_;  // the first tensor seen ready
  bool finished_ = false;
};

}  // namespace gradsync::daemon
