// Real gradsyncd, real rank processes: every collective is checked against the reference
// inside the ranks.
#include "tests/integration/harness.h"

#include <unistd.h>

#include <thread>

namespace gradsync::testing {
namespace {

class CollectivesTest : public DaemonTest, public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override { start_daemon(); }
};

TEST_P(CollectivesTest, EveryCollectiveOpAndDtype) {
  auto ranks = spawn_ranks("every", GetParam(), {"collectives"});
  expect_all_succeed(ranks);
}

TEST_P(CollectivesTest, ManyTensorsInRandomPerRankOrder) {
  auto ranks = spawn_ranks("random", GetParam(), {"random_order"});
  expect_all_succeed(ranks);
}

TEST_P(CollectivesTest, EveryDtypeAndOpInFlightTogether) {
  auto ranks = spawn_ranks("mixed", GetParam(), {"mixed"});
  expect_all_succeed(ranks);
}

TEST_P(CollectivesTest, GroupedSubmissionRunsAsOneUnit) {
  auto ranks = spawn_ranks("grouped", GetParam(), {"grouped"});
  expect_all_succeed(ranks);
}

INSTANTIATE_TEST_SUITE_P(LocalRanks, CollectivesTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

class NegotiationTest : public DaemonTest, public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override { start_daemon(); }
};

TEST_P(NegotiationTest, MismatchedCountIsAnErrorForEveryRank) {
  auto ranks = spawn_ranks("mismatch", GetParam(), {"mismatch"});
  expect_all_succeed(ranks);
}

INSTANTIATE_TEST_SUITE_P(LocalRanks, NegotiationTest, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

class FusionTest : public DaemonTest {};

TEST_F(FusionTest, SmallThresholdSplitsBatchesAndStaysCorrect) {
  // A threshold below most tensor sizes forces one batch per tensor, and a parallel reduce for
  // every batch: the same results must come out.
  start_daemon(
      "fusion_threshold_bytes = 1024\nparallel_reduce_min_bytes = 4096\nreduce_threads = 2");
  auto ranks = spawn_ranks("fusion", 2, {"random_order"});
  expect_all_succeed(ranks);
}

class IsolationTest : public DaemonTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run ranks as two uids";
    start_daemon();
  }
};

TEST_F(IsolationTest, TwoJobsOfTwoUidsSideBySide) {
  auto root_job = spawn_ranks("root-job", 2, {"random_order"});
  auto nobody_job = spawn_ranks("nobody-job", 2, {"random_order"}, {"--as-uid", "65534"});
  expect_all_succeed(root_job);
  expect_all_succeed(nobody_job);
}

TEST_F(IsolationTest, ForeignUidCannotJoinAJob) {
  auto owner = spawn_rank("owned", 0, 2, {"loop", "4096"});
  // Let the owner's hello create the job.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto intruder = spawn_rank("owned", 1, 2, {"join"}, {"--as-uid", "65534"});
  const auto status = intruder.wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status);
  EXPECT_EQ(*status, GRADSYNC_ERR_PERMISSION);
  // The job itself is untouched: its real rank 1 can still join.
  auto rank1 = spawn_rank("owned", 1, 2, {"join"});
  EXPECT_EQ(rank1.wait_for(std::chrono::seconds(30)), std::optional<int>(0));
}

}  // namespace
}  // namespace gradsync::testing
