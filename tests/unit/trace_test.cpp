// The trace recorder's bounds (steps, events, time) and its hand-over; the step meter's
// figures; the Chrome trace it renders to.
#include "daemon/job/trace.h"
#include "daemon/control/admin.h"
#include "daemon/job/step_meter.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Recording {
  std::future<TraceData> result;
  std::unique_ptr<TraceRecorder> recorder;
};

Recording start(uint32_t steps, uint32_t max_events,
                Clock::duration timeout = std::chrono::hours(1)) {
  std::promise<TraceData> promise;
  Recording r{promise.get_future(), nullptr};
  r.recorder = std::make_unique<TraceRecorder>(
      "job", TraceRecorder::Limits{steps, max_events, Clock::now() + timeout}, std::move(promise));
  return r;
}

bool ready(std::future<TraceData>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

TEST(TraceRecorder, EndsAfterTheAskedStepsCountedByTheFirstTensor) {
  Recording r = start(2, 1000);
  const auto t = Clock::now();
  for (int step = 0; step < 3; ++step) {
    for (const char* name : {"a", "b", "c"}) {
      r.recorder->on_ready(name);
      r.recorder->record(name, TracePhase::kLocalReduce, t, t + milliseconds(1), 4);
    }
  }
  ASSERT_TRUE(ready(r.result));
  const TraceData data = r.result.get();
  EXPECT_EQ(data.steps, 2u);
  EXPECT_EQ(data.ended, "2 steps recorded");
  // Steps 0 and 1 whole; step 2 ended the recording as its first tensor became ready.
  EXPECT_EQ(data.events.size(), 6u);
  EXPECT_EQ(data.tensors, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(r.recorder->finished());
}

TEST(TraceRecorder, StopsAtItsEventLimit) {
  Recording r = start(100, 5);
  const auto t = Clock::now();
  for (int i = 0; i < 10; ++i) r.recorder->record("x", TracePhase::kQueue, t, t, 1);
  const TraceData data = r.result.get();
  EXPECT_EQ(data.events.size(), 5u);
  EXPECT_EQ(data.ended, "the limit of 5 events was reached");
}

TEST(TraceRecorder, StopsAtItsDeadlineAndWhenTheJobEnds) {
  Recording late = start(100, 100, milliseconds(0));
  EXPECT_TRUE(late.recorder->check_deadline(Clock::now() + milliseconds(1)));
  EXPECT_NE(late.result.get().ended.find("time limit"), std::string::npos);

  Recording ended = start(100, 100);
  EXPECT_FALSE(ended.recorder->check_deadline(Clock::now()));
  ended.recorder.reset();  // the job went
  EXPECT_EQ(ended.result.get().ended, "the job ended");
}

TEST(TraceRecorder, ClampsEventsThatBeganBeforeTheRecording) {
  const auto before = Clock::now() - std::chrono::seconds(5);
  Recording r = start(100, 1);
  r.recorder->record("x", TracePhase::kNegotiate, before, Clock::now(), 1);
  const TraceData data = r.result.get();
  ASSERT_EQ(data.events.size(), 1u);
  EXPECT_GE(data.events[0].begin, data.started);
}

TEST(TraceJson, IsAChromeTraceWithARowPerTensor) {
  TraceData data;
  data.job = "j";
  data.started = Clock::now();
  data.tensors = {"w\"eird", "b"};
  data.events = {{0, TracePhase::kNetwork, data.started + milliseconds(1),
                  data.started + milliseconds(3), 64, 2},
                 {1, TracePhase::kQueue, data.started, data.started + milliseconds(1), 8, 1}};
  data.steps = 1;
  data.ended = "1 steps recorded";
  const auto trace = nlohmann::json::parse(trace_json(data, 3));
  int rows = 0;
  int spans = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      ++rows;
      if (e["tid"] == 1) {
        EXPECT_EQ(e["args"]["name"], "w\"eird");
      }
    }
    if (e["ph"] == "X") {
      ++spans;
      if (e["name"] == "network") {
        EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 1000);
        EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2000);
        EXPECT_EQ(e["args"]["fused"], 2);
        EXPECT_EQ(e["tid"], 1);
      }
    }
  }
  EXPECT_EQ(rows, 2);
  EXPECT_EQ(spans, 2);
  EXPECT_EQ(trace["otherData"]["node_rank"], 3);
}

TEST(StepMeter, BusBandwidthOfTheLastWholeStep) {
  StepMeter meter;
  const auto t0 = Clock::now();
  EXPECT_EQ(meter.last_bus_bandwidth(), 0);
  meter.on_ready("first", t0);
  meter.on_ready("second", t0);
  meter.on_completed(1e6, t0 + milliseconds(1));
  meter.on_completed(1e6, t0 + milliseconds(2));
  EXPECT_EQ(meter.last_bus_bandwidth(), 0);  // the step has not ended
  meter.on_ready("first", t0 + milliseconds(10));
  // 2 MB over 2 ms (first ready to last done), not the 10 ms until the next step.
  EXPECT_NEAR(meter.last_bus_bandwidth(), 1e9, 1e3);
}

TEST(StepMeter, BusFactorsAreThoseOfNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bytes(ipc::Collective::kAllreduce, 1000, 4), 1500);
  EXPECT_DOUBLE_EQ(bus_bytes(ipc::Collective::kAllreduce, 1000, 1), 0);
  EXPECT_DOUBLE_EQ(bus_bytes(ipc::Collective::kAllgather, 1000, 4), 3000);
  EXPECT_DOUBLE_EQ(bus_bytes(ipc::Collective::kReduceScatter, 1000, 4), 3000);
  EXPECT_DOUBLE_EQ(bus_bytes(ipc::Collective::kAllToAll, 1000, 4), 3000);
  EXPECT_DOUBLE_EQ(bus_bytes(ipc::Collective::kBroadcast, 1000, 4), 1000);
  EXPECT_DOUBLE_EQ(bus_bytes(ipc::Collective::kBarrier, 1000, 4), 0);
}

}  // namespace
}  // namespace gradsync::daemon
