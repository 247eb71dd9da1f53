// How an allreduce through aggregators is cut (docs/aggregators.md). Workers and aggregators
// compute the same plan from the same few numbers: a collective of `count` elements is cut
// into chunks of at most `chunk_bytes`, dealt round-robin to the job's aggregators starting at
// one that rotates with the collective's number, so that collectives of one chunk spread over
// every aggregator too. Each aggregator numbers its chunks from 0 (their "local" index), which
// with the collective's number makes the tags of their pushes and sums.
#pragma once

#include "daemon/links/links.h"

#include <algorithm>
#include <cstdint>

namespace gradsync::daemon {

namespace aggregation {
// Bounds every side checks: a job's aggregators, a chunk's size, and chunks per aggregator and
// collective (their local index is 16 bits of the tag).
inline constexpr uint32_t kMaxAggregators = 64;
inline constexpr uint64_t kMinChunkBytes = 4 << 10;
inline constexpr uint64_t kMaxChunkBytes = 64 << 20;
inline constexpr uint64_t kMaxLocalChunks = 0x10000;
}  // namespace aggregation

class AggregationPlan {
 public:
  AggregationPlan(uint64_t count, size_t element_bytes, uint64_t chunk_bytes, uint32_t aggregators,
                  uint32_t sequence)
      : count_(count),
        chunk_elements_(std::max<uint64_t>(1, chunk_bytes / element_bytes)),
        aggregators_(aggregators),
        rotation_(sequence % aggregators) {}

  uint64_t chunks() const { return (count_ + chunk_elements_ - 1) / chunk_elements_; }
  uint64_t begin(uint64_t chunk) const { return chunk * chunk_elements_; }
  uint64_t end(uint64_t chunk) const { return std::min(count_, (chunk + 1) * chunk_elements_); }
  uint32_t aggregator_of(uint64_t chunk) const {
    return static_cast<uint32_t>((chunk + rotation_) % aggregators_);
  }
  uint64_t local_index(uint64_t chunk) const { return chunk / aggregators_; }
  // The chunks aggregator `a` sums, and its `local`-th.
  uint64_t chunks_of(uint32_t a) const {
    const uint64_t first = first_of(a);
    return first < chunks() ? (chunks() - first + aggregators_ - 1) / aggregators_ : 0;
  }
  uint64_t chunk(uint32_t a, uint64_t local) const { return first_of(a) + local * aggregators_; }
  // Whether no aggregator gets more chunks than a tag can name.
  bool fits_tags() const { return chunks() <= aggregation::kMaxLocalChunks * aggregators_; }

 private:
  uint64_t first_of(uint32_t a) const { return (a + aggregators_ - rotation_) % aggregators_; }

  uint64_t count_;
  uint64_t chunk_elements_;
  uint32_t aggregators_;
  uint32_t rotation_;
};

}  // namespace gradsync::daemon
