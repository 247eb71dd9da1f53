#include "daemon/engine/executor.h"

#include "daemon/collectives/local/local_work.h"

#include <algorithm>

namespace gradsync::daemon {
namespace {

// Runs the byte range [begin, end) of the batch's concatenated work, cut at element bounds.
void run_range(const std::vector<LocalWork>& works, uint64_t begin, uint64_t end) {
  uint64_t offset = 0;  // start of works[i] on the byte line
  for (const LocalWork& work : works) {
    const uint64_t bytes = work.elements * work.element_bytes;
    const uint64_t lo = std::max(begin, offset);
    const uint64_t hi = std::min(end, offset + bytes);
    if (lo < hi) {
      // Element bounds: round both ends up, so neighbouring parts meet at the same element.
      const uint64_t first = (lo - offset + work.element_bytes - 1) / work.element_bytes;
      const uint64_t last = (hi - offset + work.element_bytes - 1) / work.element_bytes;
      if (first < last) work.run(first, last);
    }
    offset += bytes;
    if (offset >= end) break;
  }
}

}  // namespace

BatchStats execute_batch(std::vector<ReadyUnit>& batch, ReducePool& pool,
                         uint64_t parallel_min_bytes) {
  std::vector<LocalWork> works;
  BatchStats stats;
  for (const auto& unit : batch) {
    for (const auto& collective : unit.collectives) {
      works.push_back(local_work_for(collective));
      stats.bytes += works.back().elements * works.back().element_bytes;
    }
  }
  const uint64_t wanted = std::max<uint64_t>(1, stats.bytes / parallel_min_bytes);
  stats.parts = static_cast<unsigned>(std::min<uint64_t>(wanted, pool.size()));
  if (stats.parts <= 1) {
    run_range(works, 0, stats.bytes);
  } else {
    const uint64_t per_part = (stats.bytes + stats.parts - 1) / stats.parts;
    pool.run(stats.parts, [&](unsigned part) {
      const uint64_t begin = part * per_part;
      run_range(works, begin, std::min(stats.bytes, begin + per_part));
    });
  }
  for (auto& unit : batch) {
    for (auto& collective : unit.collectives) {
      for (auto& s : collective.ranks) complete(s, GRADSYNC_OK);
    }
  }
  return stats;
}

}  // namespace gradsync::daemon
