#include "daemon/job/autotune.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <numeric>
#include <random>

namespace gradsync::daemon {
namespace {

// The grid. Fusion below 1 MiB and pieces below 256 KiB cost more in per-collective and
// per-piece work than they gain anywhere, and fusion past 64 MiB only delays a step's first
// bytes: the first stage searches every pair of these.
constexpr std::array<uint64_t, 4> kFusionThresholds{1 << 20, 4 << 20, 16 << 20, 64 << 20};
constexpr std::array<uint64_t, 4> kPieces{256 << 10, 1 << 20, 4 << 20, 16 << 20};
// The second stage's, across nodes.
constexpr std::array<uint32_t, 4> kHolds{0, 25, 50, 100};
constexpr std::array<uint64_t, 4> kRingMins{0, 256 << 10, 4 << 20, 64 << 20};

constexpr uint32_t kMaxCandidates = kFusionThresholds.size() * kPieces.size();
// The candidates' order comes from a fixed seed: a job tuned twice tries the same settings.
constexpr uint32_t kSeed = 0x9e3779b9;

// The steps a stage of `candidates` (a power of two) with `per_turn` measured steps per turn
// in its first round takes at most: log2(candidates) rounds, round k giving candidates / 2^k
// candidates a warm-up step and per_turn * 2^k measured ones each.
uint64_t stage_steps(uint32_t candidates, uint32_t per_turn) {
  if (candidates < 2) return 0;
  const auto rounds = static_cast<uint64_t>(std::countr_zero(candidates));
  return (2 * uint64_t{candidates} - 2) + uint64_t{per_turn} * candidates * rounds;
}

// The most candidates (up to `most`) that `budget` steps afford with two measured steps a turn
// in the first round (one where two do not fit: a single step's score is mostly noise on a
// shared machine), then the most measured steps a turn it affords them; no candidates where
// not even two fit.
template <typename Plan>
Plan plan(uint64_t budget, uint32_t most) {
  for (const uint32_t least_per_turn : {2u, 1u}) {
    uint32_t count = std::bit_floor(most);
    while (count > 2 && stage_steps(count, least_per_turn) > budget) count /= 2;
    if (stage_steps(count, least_per_turn) > budget) continue;
    uint32_t per_turn = least_per_turn;
    while (stage_steps(count, per_turn + 1) <= budget) ++per_turn;
    return {count, per_turn};
  }
  return {};
}

// `all` in the seed's order, with `first` (where it is among them) moved to the front, cut to
// `count`.
std::vector<TunedSettings> pick(std::vector<TunedSettings> all, const TunedSettings& first,
                                uint32_t count) {
  std::mt19937 random(kSeed);
  std::shuffle(all.begin(), all.end(), random);
  if (const auto it = std::find(all.begin(), all.end(), first); it != all.end()) {
    std::rotate(all.begin(), it, it + 1);
  }
  all.resize(std::min<size_t>(all.size(), count));
  return all;
}

}  // namespace

std::string describe(const TunedSettings& settings) {
  return fmt::format(
      "fusion_threshold_bytes={} piece_bytes={} negotiation_hold_us={} ring_min_bytes={}",
      settings.fusion_threshold_bytes, settings.piece_bytes, settings.negotiation_hold_us,
      settings.ring_min_bytes);
}

Autotuner::Autotuner(const TunedSettings& start, const AutotuneLimits& limits,
                     Clock::time_point now)
    : limits_(limits), deadline_(now + limits.max_time) {
  candidates_.push_back({start});  // what runs until the search starts, or for good without one
  const bool second = limits.tune_hold || limits.tune_crossover;
  // The second stage's least: four candidates a measured step each, a quarter of the steps at
  // most; the first stage has the rest, the second what the first leaves.
  const uint64_t reserve = second ? std::min<uint64_t>(stage_steps(4, 1), limits.max_steps / 4) : 0;
  plans_[0] = plan<StagePlan>(limits.max_steps - reserve, kMaxCandidates);
  if (second) {
    const uint32_t second_most =
        (limits.tune_hold ? kHolds.size() : 1) * (limits.tune_crossover ? kRingMins.size() : 1);
    plans_[1] = plan<StagePlan>(limits.max_steps - stage_steps(plans_[0].count, plans_[0].per_turn),
                                second_most);
  }
  if (plans_[0].count == 0) {
    done_ = true;  // too few steps to compare even two candidates: the job keeps its settings
    return;
  }
  start_stage(0, start);
}

void Autotuner::start_stage(uint32_t stage, const TunedSettings& base) {
  std::vector<TunedSettings> all;
  if (stage == 0) {
    for (const uint64_t fusion : kFusionThresholds) {
      for (const uint64_t piece : kPieces) {
        all.push_back({fusion, piece, base.negotiation_hold_us, base.ring_min_bytes});
      }
    }
  } else {
    for (const uint32_t hold : kHolds) {
      for (const uint64_t ring_min : kRingMins) {
        TunedSettings s = base;
        if (limits_.tune_hold) s.negotiation_hold_us = hold;
        if (limits_.tune_crossover) s.ring_min_bytes = ring_min;
        if (std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
      }
    }
  }
  stage_ = stage;
  round_ = 0;
  alive_.clear();
  for (const TunedSettings& s : pick(std::move(all), base, plans_[stage].count)) {
    alive_.push_back(candidates_.size());
    candidates_.push_back({s});
  }
  move_to(0);
}

void Autotuner::move_to(size_t position) {
  position_ = position;
  turn_steps_ = 0;
  const size_t next = alive_[position];
  warming_ = candidates_[next].settings != candidates_[current_].settings || steps_ == 0;
  current_ = next;
}

bool Autotuner::on_step(double bus_bytes, double seconds, Clock::time_point now) {
  if (done_) return false;
  ++steps_;
  const TunedSettings before = current();
  if (warming_) {
    warming_ = false;
  } else if (seconds > 0) {
    Candidate& c = candidates_[current_];
    c.bus_bytes += bus_bytes;
    c.seconds += seconds;
    ++c.steps;
    if (++turn_steps_ == plans_[stage_].per_turn << round_) {
      trials_.push_back({stage_, round_, c.settings, turn_steps_, c.score()});
      if (position_ + 1 < alive_.size()) {
        move_to(position_ + 1);
      } else {
        end_round();
      }
    }
  }
  if (!done_ && (steps_ >= limits_.max_steps || now >= deadline_)) finish(best_measured(), true);
  return current() != before;
}

void Autotuner::end_round() {
  // The better half by score over every step measured so far: the survivors' earlier rounds
  // count too, so each round's ranking rests on more steps than the one before.
  std::stable_sort(alive_.begin(), alive_.end(), [&](size_t a, size_t b) {
    return candidates_[a].score() > candidates_[b].score();
  });
  alive_.resize(alive_.size() / 2);
  ++round_;
  if (alive_.size() > 1) {
    move_to(0);
  } else if (stage_ == 0 && plans_[1].count > 0) {
    start_stage(1, candidates_[alive_.front()].settings);
  } else {
    finish(alive_.front(), false);
  }
}

size_t Autotuner::best_measured() const {
  size_t best = current_;
  double score = -1;
  for (size_t c = 0; c < candidates_.size(); ++c) {
    if (candidates_[c].steps > 0 && candidates_[c].score() > score) {
      score = candidates_[c].score();
      best = c;
    }
  }
  return score < 0 ? 0 : best;  // nothing measured: the start
}

void Autotuner::finish(size_t candidate, bool cut_short) {
  current_ = candidate;
  done_ = true;
  cut_short_ = cut_short;
}

double Autotuner::best_bus_bytes_per_second() const {
  return done_ ? candidates_[current_].score() : candidates_[best_measured()].score();
}

}  // namespace gradsync::daemon
