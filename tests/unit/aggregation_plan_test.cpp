#include "daemon/links/aggregation_plan.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace gradsync::daemon {
namespace {

// Every element is in exactly one chunk, each chunk goes to one aggregator, and an
// aggregator's local indices number its chunks 0, 1, ... in order: what workers and the
// aggregator each derive from the same numbers.
TEST(AggregationPlan, EveryChunkHasOneAggregatorAndOneLocalIndex) {
  for (const uint64_t count : {uint64_t{1}, uint64_t{1023}, uint64_t{1024}, uint64_t{10'001}}) {
    for (const uint32_t aggregators : {1u, 2u, 3u, 4u}) {
      for (const uint32_t sequence : {0u, 1u, 5u}) {
        SCOPED_TRACE(::testing::Message() << count << " elements, " << aggregators
                                          << " aggregators, collective " << sequence);
        const AggregationPlan plan(count, 4, 4096, aggregators, sequence);
        ASSERT_EQ(plan.chunks(), (count + 1023) / 1024);
        uint64_t covered = 0;
        std::vector<std::set<uint64_t>> locals(aggregators);
        for (uint64_t c = 0; c < plan.chunks(); ++c) {
          EXPECT_EQ(plan.begin(c), covered);
          EXPECT_GT(plan.end(c), plan.begin(c));
          EXPECT_LE(plan.end(c) - plan.begin(c), 1024u);
          covered = plan.end(c);
          const uint32_t a = plan.aggregator_of(c);
          ASSERT_LT(a, aggregators);
          EXPECT_EQ(plan.chunk(a, plan.local_index(c)), c);
          EXPECT_TRUE(locals[a].insert(plan.local_index(c)).second);
        }
        EXPECT_EQ(covered, count);
        uint64_t total = 0;
        for (uint32_t a = 0; a < aggregators; ++a) {
          EXPECT_EQ(plan.chunks_of(a), locals[a].size()) << "aggregator " << a;
          if (!locals[a].empty()) {
            EXPECT_EQ(*locals[a].rbegin(), locals[a].size() - 1);
          }
          total += plan.chunks_of(a);
        }
        EXPECT_EQ(total, plan.chunks());
      }
    }
  }
}

// Collectives of a single chunk rotate over the aggregators rather than all landing on one.
TEST(AggregationPlan, SingleChunkCollectivesRotate) {
  std::set<uint32_t> used;
  for (uint32_t sequence = 0; sequence < 3; ++sequence) {
    used.insert(AggregationPlan(10, 4, 4096, 3, sequence).aggregator_of(0));
  }
  EXPECT_EQ(used.size(), 3u);
}

TEST(AggregationPlan, KnowsWhenATagCannotNameEveryChunk) {
  EXPECT_TRUE(AggregationPlan(aggregation::kMaxLocalChunks * 1024, 4, 4096, 1, 0).fits_tags());
  EXPECT_FALSE(AggregationPlan(aggregation::kMaxLocalChunks * 1024 + 1, 4, 4096, 1, 0).fits_tags());
}

}  // namespace
}  // namespace gradsync::daemon
