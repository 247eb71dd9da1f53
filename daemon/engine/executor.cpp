#include "daemon/engine/executor.h"

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

LocalBatch::LocalBatch(std::vector<ReadyUnit> units) : units_(std::move(units)) {
  for (const auto& unit : units_) {
    for (const auto& collective : unit.collectives) {
      works_.push_back(local_work_for(collective));
      bytes_ += works_.back().elements * works_.back().element_bytes;
    }
  }
}

void LocalBatch::run(uint64_t bytes, ReducePool& pool, uint64_t parallel_min_bytes) {
  const uint64_t begin = done_;
  const uint64_t end = std::min(bytes_, begin + std::max<uint64_t>(bytes, 1));
  const uint64_t span = end - begin;
  const uint64_t wanted = std::max<uint64_t>(1, span / parallel_min_bytes);
  const auto parts = static_cast<unsigned>(std::min<uint64_t>(wanted, pool.size()));
  if (parts <= 1) {
    run_range(works_, begin, end);
  } else {
    const uint64_t per_part = (span + parts - 1) / parts;
    pool.run(parts, [&](unsigned part) {
      const uint64_t from = begin + part * per_part;
      run_range(works_, from, std::min(end, from + per_part));
    });
  }
  done_ = end;
}

void LocalBatch::complete() {
  for (auto& unit : units_) {
    for (auto& collective : unit.collectives) {
      for (auto& s : collective.ranks) daemon::complete(s, GRADSYNC_OK);
    }
  }
}

}  // namespace gradsync::daemon
