// Faults become errors within a bound, and leave nothing behind.
#include "tests/integration/harness.h"

#include <signal.h>

#include <filesystem>
#include <thread>

namespace gradsync::testing {
namespace {

using Clock = std::chrono::steady_clock;

class FaultsTest : public DaemonTest {
 protected:
  void SetUp() override { start_daemon(); }
};

TEST_F(FaultsTest, KilledRankFailsItsPeersWithinFiveSecondsAndFreesItsMemory) {
  const DaemonResources baseline = resources_of(daemon().process().pid());
  auto ranks = spawn_ranks("victim", 3, {"loop", std::to_string(1 << 20)});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // well into the loop
  ranks[1].signal(SIGKILL);
  const auto killed_at = Clock::now();
  for (size_t r : {0u, 2u}) {
    const auto status = ranks[r].wait_for(std::chrono::seconds(5));
    ASSERT_TRUE(status) << "rank " << r << " hung after its peer was killed";
    EXPECT_EQ(*status, GRADSYNC_ERR_PEER_FAILED) << "rank " << r;
  }
  EXPECT_LT(Clock::now() - killed_at, std::chrono::seconds(5));
  ranks[1].wait();
  expect_resources_return_to(baseline);
}

TEST_F(FaultsTest, JobCanFormAgainAfterAFailure) {
  auto ranks = spawn_ranks("again", 2, {"loop", "4096"});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ranks[0].signal(SIGKILL);
  ASSERT_EQ(ranks[1].wait_for(std::chrono::seconds(5)),
            std::optional<int>(GRADSYNC_ERR_PEER_FAILED));
  ranks[0].wait();
  auto next = spawn_ranks("again", 2, {"grouped"});
  expect_all_succeed(next);
}

TEST_F(FaultsTest, ClientsComingAndGoingLeaveNothingBehind) {
  const DaemonResources baseline = resources_of(daemon().process().pid());
  for (int round = 0; round < 5; ++round) {
    auto ranks = spawn_ranks("churn-" + std::to_string(round), 2, {"grouped"});
    expect_all_succeed(ranks);
  }
  expect_resources_return_to(baseline);
}

TEST_F(FaultsTest, SecondDaemonOnTheSameSocketRefusesToStart) {
  tools::ChildProcess second(
      {build_dir() + "/gradsyncd", "--socket", socket(), "--metrics-listen", ""}, {});
  const auto status = second.wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(status);
  EXPECT_NE(*status, 0);
  // The first daemon still serves.
  auto ranks = spawn_ranks("still-serving", 2, {"grouped"});
  expect_all_succeed(ranks);
}

class FormationTest : public DaemonTest {};

TEST_F(FormationTest, RankThatNeverConnectsFailsTheJobNamingIt) {
  start_daemon("job_formation_timeout_seconds = 1");
  // Ranks 0 and 2 of 3 start; rank 1 never does.
  auto rank0 = spawn_rank("incomplete", 0, 3, {"loop", "4096"});
  auto rank2 = spawn_rank("incomplete", 2, 3, {"loop", "4096"});
  for (auto* rank : {&rank0, &rank2}) {
    const auto status = rank->wait_for(std::chrono::seconds(10));
    ASSERT_TRUE(status) << "a rank waited forever for a peer that never came";
    EXPECT_EQ(*status, GRADSYNC_ERR_TIMEOUT);
  }
}

class ShutdownTest : public DaemonTest {
 protected:
  void SetUp() override { start_daemon(); }
};

class ShutdownWhileWaitingTest : public ShutdownTest,
                                 public ::testing::WithParamInterface<const char*> {};

TEST_P(ShutdownWhileWaitingTest, SigtermMidStepFailsRanksAndCleansUp) {
  auto ranks = spawn_ranks("shutdown", 2, {GetParam(), std::to_string(4 << 20)});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::string socket_path = socket();
  const auto start = Clock::now();
  EXPECT_EQ(daemon().stop(), 0);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(std::filesystem::exists(socket_path));
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto status = ranks[r].wait_for(std::chrono::seconds(5));
    ASSERT_TRUE(status) << "rank " << r << " hung after the daemon stopped";
    EXPECT_EQ(*status, GRADSYNC_ERR_DAEMON_GONE) << "rank " << r;
  }
}

TEST_P(ShutdownWhileWaitingTest, KilledDaemonIsAnErrorWithinABound) {
  // No completion comes from a daemon killed with SIGKILL: the ranks must notice the closed
  // connection themselves.
  auto ranks = spawn_ranks("killed", 2, {GetParam(), std::to_string(4 << 20)});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill_daemon();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto status = ranks[r].wait_for(std::chrono::seconds(5));
    ASSERT_TRUE(status) << "rank " << r << " hung after the daemon was killed";
    EXPECT_EQ(*status, GRADSYNC_ERR_DAEMON_GONE) << "rank " << r;
  }
}

// Ranks blocked in gradsync_wait, and ranks polling with gradsync_test.
INSTANTIATE_TEST_SUITE_P(WaitStyles, ShutdownWhileWaitingTest,
                         ::testing::Values("loop", "loop_polling"));

}  // namespace
}  // namespace gradsync::testing
