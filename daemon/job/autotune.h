// A job's settings tuned while it runs (docs/autotune.md). Over the job's first steps a
// successive-halving search tries candidate settings, each for a few steps, scored by the bus
// bytes per second of those steps (StepMeter); each round keeps the better half and measures
// it twice as long, until one is left. It runs in two stages: first the fusion threshold and
// the piece, over the whole of their grid (they interact: the piece bounds how a fused batch
// pipelines); then, across nodes, the negotiation hold and the ring crossover, with the first
// stage's winner. Pure logic over step measurements: the Job feeds it its steps and applies
// what current() says (across nodes, node 0 runs it and announces current() with its
// negotiation cycles, so every node applies the same settings from the same cycle).
// Engine-thread only.
//
// Why successive halving, not Bayesian optimisation (Horovod's): a step's score on a shared
// machine is noisy, and the search space is a small grid. Halving spends its steps where the
// scores are close, measures the finalists longest, and its step budget is known before it
// starts, where a Gaussian process would need a noise model to trust and buys little on a grid
// of a few hundred points.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace gradsync::daemon {

// What autotune sets, per job.
struct TunedSettings {
  uint64_t fusion_threshold_bytes = 64ull << 20;
  uint64_t piece_bytes = 4ull << 20;  // the pipeline's piece: local batches, the ring's pieces
  uint32_t negotiation_hold_us = 50;  // across nodes (Negotiator, "holding a join")
  // Across nodes, with the algorithm left to gradsync: allreduces of at least this many bytes
  // take the ring, smaller ones halving-doubling; 0: the cost model chooses.
  uint64_t ring_min_bytes = 0;
  bool operator==(const TunedSettings&) const = default;
};

// What node 0 tells the other nodes of a job it tunes, with each cycle.
struct TuningAnnouncement {
  TunedSettings settings;
  bool search_done = false;  // the settings stay for the rest of the job
  bool operator==(const TuningAnnouncement&) const = default;
};

// The pieces and holds a node takes from node 0 (pipeline_piece_bytes' range).
inline constexpr uint64_t kMinTunedPieceBytes = 4 << 10;
inline constexpr uint64_t kMaxTunedPieceBytes = 1ull << 30;
inline constexpr uint32_t kMaxTunedHoldMicroseconds = 1'000'000;

// "fusion_threshold_bytes=... piece_bytes=..." for logs and gradsyncctl.
std::string describe(const TunedSettings& settings);

struct AutotuneLimits {
  uint32_t max_steps = 200;  // steps the search may take, warm-up steps included
  std::chrono::seconds max_time{120};
  // What the search varies besides the fusion threshold and the piece: the hold and the
  // crossover mean something across nodes only, the crossover only when the job does not force
  // an algorithm.
  bool tune_hold = false;
  bool tune_crossover = false;
};

// One candidate's turn in one round.
struct AutotuneTrial {
  uint32_t stage = 0;  // 0: fusion threshold and piece; 1: hold and crossover
  uint32_t round = 0;
  TunedSettings settings;
  uint32_t steps = 0;               // measured in this turn
  double bus_bytes_per_second = 0;  // over all of the candidate's measured steps so far
  bool chosen = false;              // not a trial: the search's choice (Job's log)
};

class Autotuner {
 public:
  using Clock = std::chrono::steady_clock;

  // `start`: the settings the job runs with now: the first candidate where its fusion
  // threshold and piece lie on the grid, and the hold and crossover the first stage keeps.
  Autotuner(const TunedSettings& start, const AutotuneLimits& limits, Clock::time_point now);

  // The settings to run with now: the candidate on trial, or once done(), the chosen one.
  const TunedSettings& current() const { return candidates_[current_].settings; }
  // A step ended: it moved `bus_bytes` in `seconds`. Returns true when current() changed.
  // The first step after a change is not measured: part of it ran with the settings before.
  bool on_step(double bus_bytes, double seconds, Clock::time_point now);
  // The search ended: current() is kept for the rest of the job.
  bool done() const { return done_; }
  // Its step or time bound cut the search short (the best measured so far was chosen).
  bool cut_short() const { return cut_short_; }

  const std::vector<AutotuneTrial>& trials() const { return trials_; }
  uint32_t steps() const { return steps_; }  // seen, measured or not
  // Of current() once done(); of the best measured so far before (0: none measured).
  double best_bus_bytes_per_second() const;
  // Planned over both stages.
  size_t candidates() const { return plans_[0].count + plans_[1].count; }

 private:
  struct Candidate {
    TunedSettings settings;
    double bus_bytes = 0;
    double seconds = 0;
    uint32_t steps = 0;
    double score() const { return seconds > 0 ? bus_bytes / seconds : 0; }
  };
  // A stage's size: its candidates (a power of two, 0: no stage) and the measured steps of a
  // turn in its first round.
  struct StagePlan {
    uint32_t count = 0;
    uint32_t per_turn = 0;
  };
  // Makes the candidates of stage `stage` around `base` and starts its first round.
  void start_stage(uint32_t stage, const TunedSettings& base);
  void move_to(size_t position);  // within alive_
  void end_round();
  void finish(size_t candidate, bool cut_short);
  size_t best_measured() const;

  std::array<StagePlan, 2> plans_{};
  uint32_t stage_ = 0;
  std::vector<Candidate> candidates_;  // every stage's so far
  std::vector<size_t> alive_;          // into candidates_, this round's
  size_t position_ = 0;                // in alive_: whose turn it is
  size_t current_ = 0;                 // into candidates_
  uint32_t round_ = 0;
  uint32_t turn_steps_ = 0;  // measured in this turn
  bool warming_ = false;     // the next step is not measured
  uint32_t steps_ = 0;
  AutotuneLimits limits_;
  Clock::time_point deadline_;
  bool done_ = false;
  bool cut_short_ = false;
  std::vector<AutotuneTrial> trials_;
};

}  // namespace gradsync::daemon
