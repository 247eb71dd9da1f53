#include "daemon/node/rank_map.h"

#include <gmock/gmock.h>

#include <vector>

namespace gradsync::daemon {
namespace {

using ::testing::HasSubstr;

std::vector<int32_t> ranks(std::initializer_list<int32_t> list) {
  return list;
}

TEST(RankMap, KnowsEveryRanksNodeOnceEveryNodeSaid) {
  RankMap map(3, 5);
  map.add(1, ranks({2, 1, 3}));
  map.add(0, ranks({0}));
  EXPECT_EQ(map.node_of(4), std::nullopt) << "node 2 has not said yet";
  map.add(2, ranks({4}));
  EXPECT_EQ(map.problem(), std::nullopt);
  EXPECT_TRUE(map.complete());
  EXPECT_EQ(map.node_of(0), 0u);
  EXPECT_EQ(map.node_of(1), 1u);
  EXPECT_EQ(map.node_of(3), 1u);
  EXPECT_EQ(map.node_of(4), 2u);
  EXPECT_EQ(map.node_of(5), std::nullopt);
  EXPECT_EQ(map.node_of(-1), std::nullopt);
}

TEST(RankMap, ARankOnTwoNodesIsAProblemNamingBoth) {
  RankMap map(2, 2);
  map.add(1, ranks({0}));
  map.add(0, ranks({0}));
  ASSERT_TRUE(map.problem());
  EXPECT_THAT(*map.problem(), HasSubstr("rank 0 is on node 0 and on node 1"));
}

TEST(RankMap, ARankTwiceOnOneNodeIsAProblem) {
  RankMap map(2, 3);
  map.add(0, ranks({0, 0}));
  map.add(1, ranks({1}));
  ASSERT_TRUE(map.problem());
  EXPECT_THAT(*map.problem(), HasSubstr("node 0 has rank 0 twice"));
}

TEST(RankMap, RanksOutsideTheWorldOrMissingFromItAreProblems) {
  RankMap outside(2, 2);
  outside.add(0, ranks({0}));
  outside.add(1, ranks({2}));
  ASSERT_TRUE(outside.problem());
  EXPECT_THAT(*outside.problem(), HasSubstr("node 1 has rank 2, outside WORLD_SIZE 2"));

  RankMap missing(2, 4);
  missing.add(0, ranks({0, 1}));
  missing.add(1, ranks({3}));
  ASSERT_TRUE(missing.problem());
  EXPECT_THAT(*missing.problem(), HasSubstr("rank 2 is on no node"));
}

TEST(RankMap, ANodeThatDoesNotSayLeavesEveryRankUnknownAndNothingToCheck) {
  // Its daemon predates the map: every node then knows as little, and broadcasts directly.
  RankMap map(2, 3);
  map.add(0, ranks({0, 1}));
  map.add(1, std::nullopt);
  EXPECT_EQ(map.problem(), std::nullopt);
  EXPECT_FALSE(map.complete());
  EXPECT_EQ(map.node_of(0), std::nullopt);
}

TEST(RankMap, ANodeSaysOnce) {
  RankMap map(2, 2);
  map.add(0, ranks({0}));
  map.add(0, ranks({1}));  // a repeated join changes nothing
  map.add(1, ranks({1}));
  EXPECT_EQ(map.problem(), std::nullopt);
  EXPECT_EQ(map.node_of(1), 1u);
}

}  // namespace
}  // namespace gradsync::daemon
