// The jobs of the backend's point-to-point calls (client/torch/point_to_point.h): which job a
// pair of a group's ranks meets in, and as whom, on one node and across nodes.
#include "client/torch/point_to_point.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace gradsync::torch_backend {
namespace {

using ::testing::HasSubstr;

// Group rank `rank` of 4 ranks, two on each of two nodes (ranks 0 and 2 on node 0).
gradsync_options group_options(int32_t rank) {
  gradsync_options group{};
  std::strcpy(group.job, "train");
  std::strcpy(group.socket_path, "/run/gradsync/gradsyncd.sock");
  group.rank = rank;
  group.world_size = 4;
  group.local_rank = rank / 2;
  group.local_world_size = 2;
  std::strcpy(group.nodes, "198.18.0.1:9478,198.18.0.2:9478");
  group.node_rank = rank % 2;
  group.timeout_ms = 5000;
  return group;
}

const GroupLayout kLayout{
    {"198.18.0.1:9478", "198.18.0.2:9478", "198.18.0.1:9478", "198.18.0.2:9478"}};

TEST(PointToPoint, APairOnOneNodeIsAOneNodeJobOfTwoRanks) {
  const gradsync_options low = pair_options(group_options(0), kLayout, 2);
  const gradsync_options high = pair_options(group_options(2), kLayout, 0);
  for (const gradsync_options& pair : {low, high}) {
    EXPECT_STREQ(pair.job, "train.p2p.0.2");
    EXPECT_EQ(pair.world_size, 2);
    EXPECT_EQ(pair.local_world_size, 2);
    EXPECT_STREQ(pair.nodes, "");
    EXPECT_STREQ(pair.socket_path, "/run/gradsync/gradsyncd.sock");
    EXPECT_EQ(pair.timeout_ms, 5000);
  }
  EXPECT_EQ(low.rank, 0);
  EXPECT_EQ(low.local_rank, 0);
  EXPECT_EQ(high.rank, 1);
  EXPECT_EQ(high.local_rank, 1);
}

TEST(PointToPoint, APairAcrossNodesIsAJobOfTheirTwoNodes) {
  const gradsync_options low = pair_options(group_options(2), kLayout, 3);
  const gradsync_options high = pair_options(group_options(3), kLayout, 2);
  for (const gradsync_options& pair : {low, high}) {
    EXPECT_STREQ(pair.job, "train.p2p.2.3");
    EXPECT_EQ(pair.world_size, 2);
    EXPECT_EQ(pair.local_rank, 0);
    EXPECT_EQ(pair.local_world_size, 1);
    // Node order follows the pair's ranks: the lower rank's node first.
    EXPECT_STREQ(pair.nodes, "198.18.0.1:9478,198.18.0.2:9478");
  }
  EXPECT_EQ(low.rank, 0);
  EXPECT_EQ(low.node_rank, 0);
  EXPECT_EQ(high.rank, 1);
  EXPECT_EQ(high.node_rank, 1);
  // Rank 1 (node 1) and rank 2 (node 0): the lower rank's node comes first.
  EXPECT_STREQ(pair_options(group_options(1), kLayout, 2).nodes, "198.18.0.2:9478,198.18.0.1:9478");
}

TEST(PointToPoint, APeerThatIsNoOtherRankOfTheGroupIsRefused) {
  for (const int peer : {-1, 1, 4}) {
    try {
      pair_options(group_options(1), kLayout, peer);
      ADD_FAILURE() << "peer " << peer << " accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_THAT(error.what(), HasSubstr("is not another rank of this group of 4"));
    }
  }
  const GroupLayout short_layout{{"198.18.0.1:9478", "198.18.0.1:9478", "198.18.0.1:9478"}};
  EXPECT_THROW(pair_options(group_options(0), short_layout, 1), std::invalid_argument);
  const GroupLayout unknown_node{{"198.18.0.1:9478", "", "198.18.0.1:9478", ""}};
  EXPECT_THROW(pair_options(group_options(0), unknown_node, 1), std::invalid_argument);
}

TEST(PointToPoint, AGroupOnOneNodeGivesNoAddressesAndItsPairsNone) {
  const GroupLayout one_node{{"", "", "", ""}};
  EXPECT_TRUE(one_node.on_one_node());
  EXPECT_FALSE(kLayout.on_one_node());
  const gradsync_options pair = pair_options(group_options(0), one_node, 1);
  EXPECT_STREQ(pair.nodes, "");
  EXPECT_EQ(pair.local_world_size, 2);
}

TEST(PointToPoint, ALongGroupJobNameIsShortenedAlikeOnEveryRank) {
  const std::string long_job(60, 'j');
  const std::string name = pair_job_name(long_job, 1000, 1001);
  EXPECT_LE(name.size(), sizeof(gradsync_options::job) - 1);
  EXPECT_THAT(name, HasSubstr(".p2p.1000.1001"));
  EXPECT_EQ(name, pair_job_name(long_job, 1000, 1001));
  // Two long names that share their first characters still name different jobs.
  EXPECT_NE(name, pair_job_name(std::string(59, 'j') + "k", 1000, 1001));
  EXPECT_EQ(pair_job_name("train", 0, 1), "train.p2p.0.1");
}

TEST(PointToPoint, APairsJobIsAPartOfTheGroupsHoldingItsTwoRanksInOrder) {
  gradsync_job_settings group{};
  group.struct_bytes = sizeof(group);
  std::strcpy(group.wire_codec, "bf16");
  for (const auto& [self, peer] : {std::pair{3, 1}, std::pair{1, 3}}) {
    const PairRanks ranks = pair_ranks(self, peer);
    EXPECT_EQ(ranks, (PairRanks{1, 3}));
    const gradsync_job_settings pair = pair_settings(group, group_options(self), ranks);
    EXPECT_STREQ(pair.parent_job, "train");
    EXPECT_EQ(pair.parent_ranks, ranks.data());
    EXPECT_STREQ(pair.wire_codec, "bf16");  // the rest as the group's
    EXPECT_EQ(pair.struct_bytes, sizeof(pair));
  }
}

TEST(PointToPoint, MessagesAreNamedByDirectionAndTag) {
  EXPECT_EQ(message_name(0, 1, 0), "p2p.0>1.tag0");
  EXPECT_NE(message_name(0, 1, 0), message_name(1, 0, 0));
  EXPECT_NE(message_name(0, 1, 0), message_name(0, 1, 1));
}

}  // namespace
}  // namespace gradsync::torch_backend
