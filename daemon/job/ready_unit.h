// What the engine runs: collectives every local rank has submitted, alone or as a group.
#pragma once

#include "daemon/job/submission.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace gradsync::daemon {

// When a collective was first submitted here and became ready here (every local rank
// submitted it), and, across nodes and only while its job is traced, when every node agreed.
struct TraceTimes {
  std::chrono::steady_clock::time_point submitted;
  std::chrono::steady_clock::time_point ready;
  std::chrono::steady_clock::time_point agreed;
};

// One collective that every local rank of the job submitted, consistently. ranks[r] is local
// rank r's submission.
struct ReadyCollective {
  std::vector<Submission> ranks;
  TraceTimes times;

  const Submission& first() const { return ranks.front(); }
  uint64_t bytes() const { return first().block_bytes(); }
  // The ranks' buffers, kept alive by whoever holds these (UCX may touch them after a failed
  // collective gave up on its operations).
  void append_memory(std::vector<std::shared_ptr<const void>>& memory) const {
    for (const auto& s : ranks) {
      memory.push_back(s.send_buffer);
      memory.push_back(s.recv_buffer);
    }
  }
};

// Collectives that run together: one, or a whole group.
struct ReadyUnit {
  std::vector<ReadyCollective> collectives;
  uint64_t bytes() const {
    uint64_t total = 0;
    for (const auto& c : collectives) total += c.bytes();
    return total;
  }
  // Its place among the job's units as they became ready here (priority.h: its age).
  uint64_t order = 0;
  // The highest of its collectives' (every rank gave each the same: find_mismatch).
  int32_t priority() const {
    int32_t highest = collectives.front().first().priority;
    for (const auto& c : collectives) highest = std::max(highest, c.first().priority);
    return highest;
  }
};

// Completes every rank's part of every collective of `unit`; returns how many parts.
inline size_t complete(const ReadyUnit& unit, gradsync_result status,
                       std::string_view message = {}) {
  size_t parts = 0;
  for (const auto& c : unit.collectives) {
    for (const auto& s : c.ranks) complete(s, status, message);
    parts += c.ranks.size();
  }
  return parts;
}

}  // namespace gradsync::daemon
