#include "daemon/links/rank_map.h"

#include <gmock/gmock.h>

#include <string>
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
  EXPECT_EQ(map.node_of(0), 0u);
  EXPECT_EQ(map.node_of(1), 1u);
  EXPECT_EQ(map.node_of(3), 1u);
  EXPECT_EQ(map.node_of(4), 2u);
  EXPECT_EQ(map.node_of(5), std::nullopt);
  EXPECT_EQ(map.node_of(-1), std::nullopt);
}

// What each node says, and the problem the map names.
struct ProblemCase {
  uint32_t nodes;
  int32_t world_size;
  std::vector<std::vector<int32_t>> ranks_by_node;  // added in reverse node order
  std::string problem;
};

class RankMapProblems : public ::testing::TestWithParam<ProblemCase> {};

TEST_P(RankMapProblems, AreNamedWithTheRankAndTheNodes) {
  const ProblemCase& c = GetParam();
  RankMap map(c.nodes, c.world_size);
  for (uint32_t node = c.nodes; node-- > 0;) map.add(node, c.ranks_by_node[node]);
  ASSERT_TRUE(map.problem());
  EXPECT_THAT(*map.problem(), HasSubstr(c.problem));
}

INSTANTIATE_TEST_SUITE_P(
    RankMap, RankMapProblems,
    ::testing::Values(ProblemCase{2, 2, {{0}, {0}}, "rank 0 is on node 0 and on node 1"},
                      ProblemCase{2, 3, {{0, 0}, {1}}, "node 0 has rank 0 twice"},
                      ProblemCase{2, 2, {{0}, {2}}, "node 1 has rank 2, outside WORLD_SIZE 2"},
                      ProblemCase{2, 4, {{0, 1}, {3}}, "rank 2 is on no node"}));

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
