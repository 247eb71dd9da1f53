// A job's two groups (client/groups.h): the node's and the one across nodes, from its layout;
// layouts that do not fit are refused with what does not fit named.
#include "client/groups.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace gradsync::client::groups {
namespace {

using ::testing::HasSubstr;

// Rank `rank` of `nodes` nodes x `per_node` ranks, nodes on 198.18.0.x.
gradsync_options job_options(int32_t rank, int32_t nodes, int32_t per_node) {
  gradsync_options job{};
  std::strcpy(job.job, "train");
  job.rank = rank;
  job.world_size = nodes * per_node;
  job.local_rank = rank % per_node;
  job.local_world_size = per_node;
  job.node_rank = -1;
  std::string list;
  for (int32_t n = 0; n < nodes && nodes > 1; ++n) {
    list += (n == 0 ? "" : ",") + std::string("198.18.0.") + std::to_string(n + 1) + ":9478";
  }
  std::strcpy(job.nodes, list.c_str());
  return job;
}

TEST(Groups, TheNodesGroupIsItsRanksOnOneNode) {
  const gradsync_options group = node_group(job_options(5, 3, 4));
  EXPECT_STREQ(group.job, "train.node");
  EXPECT_EQ(group.rank, 1);
  EXPECT_EQ(group.world_size, 4);
  EXPECT_EQ(group.local_rank, 1);
  EXPECT_EQ(group.local_world_size, 4);
  EXPECT_STREQ(group.nodes, "");
}

TEST(Groups, TheAcrossNodesGroupIsOneRankPerNodeSharingTheLocalRank) {
  const gradsync_options group = across_nodes_group(job_options(5, 3, 4));
  EXPECT_STREQ(group.job, "train.local1");
  EXPECT_EQ(group.rank, 1);
  EXPECT_EQ(group.world_size, 3);
  EXPECT_EQ(group.local_rank, 0);
  EXPECT_EQ(group.local_world_size, 1);
  EXPECT_EQ(group.node_rank, 1);
  EXPECT_STREQ(group.nodes, "198.18.0.1:9478,198.18.0.2:9478,198.18.0.3:9478");
}

TEST(Groups, OneNodeMakesAnAcrossGroupOfOne) {
  const gradsync_options group = across_nodes_group(job_options(2, 1, 4));
  EXPECT_EQ(group.world_size, 1);
  EXPECT_EQ(group.rank, 0);
  EXPECT_STREQ(group.job, "train.local2");
}

void expect_refused(const gradsync_options& job, const std::string& because) {
  for (auto derive : {&node_group, &across_nodes_group}) {
    try {
      derive(job);
      ADD_FAILURE() << "accepted; expected: " << because;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(because));
    }
  }
}

TEST(Groups, LayoutsThatDoNotFitAreRefusedWithTheReason) {
  gradsync_options uneven = job_options(0, 2, 2);
  uneven.world_size = 5;
  expect_refused(uneven, "no multiple of local world size 2");

  gradsync_options scattered = job_options(1, 2, 2);
  scattered.local_rank = 0;  // round-robin numbering: rank 1 on node 1
  expect_refused(scattered, "numbered consecutively");

  gradsync_options elsewhere = job_options(1, 2, 2);
  elsewhere.node_rank = 1;
  expect_refused(elsewhere, "is on node 1");

  gradsync_options short_list = job_options(0, 3, 2);
  std::strcpy(short_list.nodes, "198.18.0.1:9478,198.18.0.2:9478");
  expect_refused(short_list, "lists 2 node(s)");

  gradsync_options long_name = job_options(0, 2, 2);
  std::memset(long_name.job, 'j', sizeof(long_name.job) - 3);
  long_name.job[sizeof(long_name.job) - 3] = '\0';
  expect_refused(long_name, "longer than 63 bytes");
}

// Each group's ranks as the job's: what makes a group fail with a rank its job loses.
TEST(Groups, EachGroupsRanksAreNamedAsTheJobsRanks) {
  const gradsync_options job = job_options(5, 3, 4);  // node 1, local rank 1
  EXPECT_THAT(ranks_in_job(job, node_group(job)), ::testing::ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(ranks_in_job(job, across_nodes_group(job)), ::testing::ElementsAre(1, 5, 9));
  const gradsync_options alone = job_options(2, 1, 4);
  EXPECT_THAT(ranks_in_job(alone, across_nodes_group(alone)), ::testing::ElementsAre(2));
}

TEST(Groups, AGroupThatIsNeitherOfTheJobsIsRefused) {
  const gradsync_options job = job_options(5, 3, 4);
  // Another local rank's group across nodes, and the same name of another size.
  gradsync_options other = across_nodes_group(job_options(6, 3, 4));
  gradsync_options resized = node_group(job);
  resized.world_size = 2;
  for (const gradsync_options& group : {other, resized, job}) {
    try {
      ranks_in_job(job, group);
      ADD_FAILURE() << "accepted group " << group.job;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("is neither of job 'train''s groups for rank 5 "
                                      "('train.node', 'train.local1')"));
    }
  }
}

}  // namespace
}  // namespace gradsync::client::groups
