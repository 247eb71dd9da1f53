// The autotune search (daemon/job/autotune.h) on scores made up for the test, and the checks a
// node makes of the settings node 0 announces (daemon/node/negotiator.h).
#include "daemon/job/autotune.h"
#include "daemon/job/step_meter.h"
#include "daemon/node/negotiator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>

namespace gradsync::daemon {
namespace {

using Clock = Autotuner::Clock;

const TunedSettings kPoor{64 << 10, 64 << 10, 0, 0};

// Feeds the tuner steps scored by `score` (bus bytes in one second) until it is done, or
// `limit` steps; returns the steps it took and the settings each step ran with.
struct SearchRun {
  uint32_t steps = 0;
  std::set<std::pair<uint64_t, uint64_t>> tried;  // fusion threshold, piece
};
SearchRun drive(Autotuner& tuner, const std::function<double(const TunedSettings&)>& score,
                uint32_t limit, Clock::time_point now) {
  SearchRun run;
  while (!tuner.done() && run.steps < limit) {
    const TunedSettings& s = tuner.current();
    run.tried.insert({s.fusion_threshold_bytes, s.piece_bytes});
    tuner.on_step(score(s), 1.0, now);
    ++run.steps;
  }
  return run;
}

// Larger fusion and pieces near 1 MiB score best, as on a real step; every candidate scores
// differently.
double made_up_score(const TunedSettings& s) {
  const double fusion = std::log2(static_cast<double>(s.fusion_threshold_bytes));
  const double piece = std::log2(static_cast<double>(s.piece_bytes));
  return 1e9 + 1e7 * fusion - 1e6 * (piece - 20) * (piece - 20) + s.negotiation_hold_us;
}

TEST(Autotuner, SearchesTheWholeGridAndEndsWithItsBestWithinItsStepBound) {
  const auto now = Clock::now();
  Autotuner tuner(kPoor, AutotuneLimits{200, std::chrono::seconds(120), false, false}, now);
  EXPECT_EQ(tuner.candidates(), 16u);
  const SearchRun run = drive(tuner, made_up_score, 1000, now);
  ASSERT_TRUE(tuner.done());
  EXPECT_FALSE(tuner.cut_short());
  EXPECT_LE(run.steps, 200u);
  EXPECT_EQ(run.tried.size(), 16u);  // every fusion threshold with every piece
  EXPECT_FALSE(run.tried.contains({kPoor.fusion_threshold_bytes, kPoor.piece_bytes}));
  // Noise-free scores: the best of those tried wins.
  double best = 0;
  for (const auto& [fusion, piece] : run.tried) {
    best = std::max(best, made_up_score({fusion, piece, 0, 0}));
  }
  EXPECT_EQ(made_up_score(tuner.current()), best);
  EXPECT_DOUBLE_EQ(tuner.best_bus_bytes_per_second(), best);
  // On one node neither the hold nor the crossover moves.
  EXPECT_EQ(tuner.current().negotiation_hold_us, kPoor.negotiation_hold_us);
  EXPECT_EQ(tuner.current().ring_min_bytes, kPoor.ring_min_bytes);
  // Rounds of 16, 8, 4 and 2 candidates, each turn twice as long as the round before.
  ASSERT_EQ(tuner.trials().size(), 16u + 8 + 4 + 2);
  EXPECT_EQ(tuner.trials().front().steps * 8, tuner.trials().back().steps);
  // Once done, the choice stays.
  const TunedSettings chosen = tuner.current();
  EXPECT_FALSE(tuner.on_step(1, 1, now));
  EXPECT_EQ(tuner.current(), chosen);
}

// The settings a job runs with on the grid are its first candidate.
TEST(Autotuner, StartsWithTheJobsSettingsWhereTheyAreOnTheGrid) {
  const TunedSettings defaults{64 << 20, 4 << 20, 50, 0};
  Autotuner tuner(defaults, AutotuneLimits{200, std::chrono::seconds(120), false, false},
                  Clock::now());
  EXPECT_EQ(tuner.current(), defaults);
}

// Across nodes a second stage searches the hold and the crossover with the first stage's
// fusion threshold and piece, which it keeps.
TEST(Autotuner, AcrossNodesASecondStageSearchesTheHoldAndCrossover) {
  const auto now = Clock::now();
  Autotuner tuner(kPoor, AutotuneLimits{200, std::chrono::seconds(120), true, true}, now);
  EXPECT_EQ(tuner.candidates(), 16u + 4);
  std::set<uint32_t> holds;
  std::set<uint64_t> ring_mins;
  uint32_t steps = 0;
  while (!tuner.done()) {
    holds.insert(tuner.current().negotiation_hold_us);
    ring_mins.insert(tuner.current().ring_min_bytes);
    tuner.on_step(made_up_score(tuner.current()), 1.0, now);
    ++steps;
  }
  EXPECT_LE(steps, 200u);
  EXPECT_GT(holds.size(), 1u);
  EXPECT_GT(ring_mins.size(), 1u);
  const auto& trials = tuner.trials();
  ASSERT_EQ(trials.size(), (16u + 8 + 4 + 2) + (4 + 2));
  // The first stage's best: the largest fusion threshold, 1 MiB pieces.
  for (size_t t = 16 + 8 + 4 + 2; t < trials.size(); ++t) {
    EXPECT_EQ(trials[t].stage, 1u);
    EXPECT_EQ(trials[t].settings.fusion_threshold_bytes, uint64_t{64} << 20);
    EXPECT_EQ(trials[t].settings.piece_bytes, uint64_t{1} << 20);
  }
  // The made-up score prefers the longest hold; of those tried, the search found it.
  uint32_t longest = 0;
  for (size_t t = 16 + 8 + 4 + 2; t < trials.size(); ++t) {
    longest = std::max(longest, trials[t].settings.negotiation_hold_us);
  }
  EXPECT_EQ(tuner.current().negotiation_hold_us, longest);
  EXPECT_EQ(tuner.current().fusion_threshold_bytes, uint64_t{64} << 20);
}

TEST(Autotuner, FewerStepsTryFewerCandidates) {
  const auto now = Clock::now();
  // 8 candidates with two measured steps a turn need 62 steps: 4 take 22, and 3 a turn.
  Autotuner few(kPoor, AutotuneLimits{40, std::chrono::seconds(120), false, false}, now);
  EXPECT_EQ(few.candidates(), 4u);
  EXPECT_LE(drive(few, made_up_score, 1000, now).steps, 40u);
  EXPECT_TRUE(few.done());
  // Two candidates: a warm-up step and a measured one each.
  Autotuner two(kPoor, AutotuneLimits{4, std::chrono::seconds(120), false, false}, now);
  EXPECT_EQ(two.candidates(), 2u);
  EXPECT_LE(drive(two, made_up_score, 1000, now).steps, 4u);
  // Too few to compare two: the job keeps its settings.
  Autotuner none(kPoor, AutotuneLimits{3, std::chrono::seconds(120), false, false}, now);
  EXPECT_TRUE(none.done());
  EXPECT_EQ(none.current(), kPoor);
}

TEST(Autotuner, ItsTimeBoundKeepsTheBestMeasuredSoFar) {
  const auto start = Clock::now();
  Autotuner tuner(kPoor, AutotuneLimits{200, std::chrono::seconds(10), false, false}, start);
  double best = 0;
  TunedSettings best_settings;
  for (int step = 0; step < 12; ++step) {
    const TunedSettings s = tuner.current();
    const double score = made_up_score(s);
    tuner.on_step(score, 1.0, start + std::chrono::seconds(step / 2));
  }
  ASSERT_FALSE(tuner.done());
  for (const AutotuneTrial& t : tuner.trials()) {
    if (t.bus_bytes_per_second > best) {
      best = t.bus_bytes_per_second;
      best_settings = t.settings;
    }
  }
  tuner.on_step(1, 1.0, start + std::chrono::seconds(11));
  ASSERT_TRUE(tuner.done());
  EXPECT_TRUE(tuner.cut_short());
  EXPECT_EQ(tuner.current(), best_settings);
}

// The first step after a change ran partly with the settings before: it is not measured.
TEST(Autotuner, TheStepAfterAChangeIsNotMeasured) {
  const auto now = Clock::now();
  Autotuner tuner(kPoor, AutotuneLimits{200, std::chrono::seconds(120), false, false}, now);
  const TunedSettings first = tuner.current();
  EXPECT_FALSE(tuner.on_step(1e12, 1.0, now));  // warm-up: a wild score that must not count
  EXPECT_FALSE(tuner.on_step(1e9, 1.0, now));
  EXPECT_TRUE(tuner.on_step(1e9, 1.0, now));  // the turn ends
  ASSERT_EQ(tuner.trials().size(), 1u);
  EXPECT_EQ(tuner.trials()[0].settings, first);
  EXPECT_DOUBLE_EQ(tuner.trials()[0].bus_bytes_per_second, 1e9);
}

TEST(StepMeter, HandsBackEachWholeStep) {
  StepMeter meter;
  const auto t0 = StepMeter::Clock::now();
  EXPECT_FALSE(meter.on_ready("a", t0));
  EXPECT_FALSE(meter.on_ready("b", t0));
  meter.on_completed(1000, t0 + std::chrono::milliseconds(500));
  const auto step = meter.on_ready("a", t0 + std::chrono::seconds(1));
  ASSERT_TRUE(step);
  EXPECT_DOUBLE_EQ(step->bus_bytes, 1000);
  EXPECT_DOUBLE_EQ(step->seconds, 0.5);  // to its last completion
  EXPECT_DOUBLE_EQ(meter.last_bus_bandwidth(), 2000);
}

// A node takes node 0's settings only within what the daemon can run: a piece of no bytes is
// a protocol error, not a division by zero.
TEST(Negotiator, RefusesTunedSettingsOutOfRange) {
  Negotiator node1("job", 2, 1, "rank 1", 16, {1e-5, 1e-9, 1e-10},
                   [](uint32_t, capnp::MessageBuilder&) {});
  capnp::MallocMessageBuilder message;
  auto cycle = start_node_message(message, "job", 0).initCycle();
  cycle.setNumber(1);
  auto tuned = cycle.initTuned();
  tuned.setFusionThresholdBytes(1 << 20);
  tuned.setPieceBytes(0);
  try {
    node1.on_cycle(0, cycle.asReader());
    FAIL() << "a piece of 0 bytes was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("settings out of range"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradsync::daemon
