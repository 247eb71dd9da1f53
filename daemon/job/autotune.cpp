#include "daemon/job/autotune.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <numeric>
#include <random>

namespace gradsync::daemon {
namespace {

// The grid each setting's candidates come from. A piece below 64 KiB costs more in
// per-piece work than pipelining gains anywhere, and fusion past 64 MiB only delays the first
// bytes of a step.
constexpr std::array<uint64_t, 5> kFusionThresholds{64 << 10, 1 << 20, 4 << 20, 16 << 20,
                                                    64 << 20};
constexpr std::array<uint64_t, 5> kPieces{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
constexpr std::array<uint32_t, 4> kHolds{0, 25, 50, 100};
constexpr std::array<uint64_t, 4> kRingMins{0, 256 << 10, 4 << 20, 64 << 20};

// At most this many candidates, the start among them: a power of two, halved each round.
constexpr uint32_t kMaxCandidates = 16;
// The candidates come from a fixed seed: a job tuned twice tries the same settings.
constexpr uint32_t kSeed = 0x9e3779b9;

// The steps a search of `candidates` (a power of two) with `per_turn` measured steps per turn
// in its first round takes at most: log2(candidates) rounds, round k giving candidates / 2^k
// candidates a warm-up step and per_turn * 2^k measured ones each.
uint64_t search_steps(uint32_t candidates, uint32_t per_turn) {
  const auto rounds = static_cast<uint64_t>(std::countr_zero(candidates));
  return (2 * uint64_t{candidates} - 2) + uint64_t{per_turn} * candidates * rounds;
}

// A Latin hypercube over the grid: each setting's values spread evenly over the candidates,
// their combinations shuffled. Settings the limits leave alone keep `start`'s value.
std::vector<TunedSettings> sample(const TunedSettings& start, const AutotuneLimits& limits,
                                  uint32_t count) {
  std::mt19937 random(kSeed);
  auto column = [&](size_t values) {
    std::vector<size_t> order(count);
    for (uint32_t i = 0; i < count; ++i) order[i] = i % values;
    std::shuffle(order.begin(), order.end(), random);
    return order;
  };
  const auto fusion = column(kFusionThresholds.size());
  const auto piece = column(kPieces.size());
  const auto hold = column(kHolds.size());
  const auto ring_min = column(kRingMins.size());
  std::vector<TunedSettings> out{start};
  for (uint32_t i = 0; out.size() < count + 1 && i < count; ++i) {
    TunedSettings s = start;
    s.fusion_threshold_bytes = kFusionThresholds[fusion[i]];
    s.piece_bytes = kPieces[piece[i]];
    if (limits.tune_hold) s.negotiation_hold_us = kHolds[hold[i]];
    if (limits.tune_crossover) s.ring_min_bytes = kRingMins[ring_min[i]];
    // A combination drawn twice (or the start's) would be measured twice: try the next piece.
    for (size_t shift = 1; shift <= kPieces.size() &&
                           std::find(out.begin(), out.end(), s) != out.end();
         ++shift) {
      s.piece_bytes = kPieces[(piece[i] + shift) % kPieces.size()];
    }
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
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
  // The most candidates the step bound affords with at least one measured step a turn, then
  // the most measured steps a turn it affords them.
  uint32_t count = kMaxCandidates;
  while (count > 2 && search_steps(count, 1) > limits.max_steps) count /= 2;
  if (search_steps(count, 1) > limits.max_steps) {
    candidates_.push_back({start});
    done_ = true;  // too few steps to compare even two candidates
    return;
  }
  steps_per_turn_ = 1;
  while (search_steps(count, steps_per_turn_ + 1) <= limits.max_steps) ++steps_per_turn_;
  for (const TunedSettings& s : sample(start, limits, count - 1)) candidates_.push_back({s});
  // The grid may hold fewer distinct combinations than asked for: halving wants a power of two.
  candidates_.resize(std::bit_floor(candidates_.size()));
  alive_.resize(candidates_.size());
  std::iota(alive_.begin(), alive_.end(), size_t{0});
  if (alive_.size() < 2) {
    done_ = true;
    return;
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
    if (++turn_steps_ == steps_per_turn_ << round_) {
      trials_.push_back({round_, c.settings, turn_steps_, c.score()});
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
  if (alive_.size() == 1) {
    finish(alive_.front(), false);
  } else {
    move_to(0);
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
