// Priorities between one job's collectives (docs/priority.md). A rank gives each collective a
// priority (gradsync_set_priority); where several of a job's are ready, the one of highest
// priority runs first, and one that has waited long enough outranks newer ones of a higher
// priority: its priority rises by one for every `aging_step` it has waited, so no collective
// starves under a stream of higher-priority ones. Equal priorities keep their order: the
// older has waited longer.
#pragma once

#include <chrono>
#include <cstdint>

namespace gradsync::daemon {

struct PriorityAging {
  std::chrono::steady_clock::duration step = std::chrono::milliseconds(100);

  // The priority of work given `priority`, waiting since `since`, at `now`.
  int64_t effective(int32_t priority, std::chrono::steady_clock::time_point since,
                    std::chrono::steady_clock::time_point now) const {
    const auto waited = now > since ? now - since : std::chrono::steady_clock::duration{};
    return priority + static_cast<int64_t>(waited / step);
  }
};

}  // namespace gradsync::daemon
