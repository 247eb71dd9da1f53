// Real gradsyncd, real rank processes: every collective is checked against the reference
// inside the ranks.
#include "tests/integration/harness.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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

TEST_P(CollectivesTest, PrioritiesInFlightTogether) {
  auto ranks = spawn_ranks("priorities", GetParam(), {"priorities"});
  expect_all_succeed(ranks);
}

TEST_P(CollectivesTest, GroupedSubmissionRunsAsOneUnit) {
  auto ranks = spawn_ranks("grouped", GetParam(), {"grouped"});
  expect_all_succeed(ranks);
}

TEST_P(CollectivesTest, WaitWithATimeoutReturnsInProgressThenTheResult) {
  auto ranks = spawn_ranks("wait_timeout", GetParam(), {"wait_timeout"});
  expect_all_succeed(ranks);
}

// Autotune on one node (docs/autotune.md): a search from a poor configuration ends within its
// step bound with one of the settings it tried, and every step's results are exact throughout.
TEST_P(CollectivesTest, AutotuneEndsWithinItsBoundAndResultsStayExact) {
  constexpr uint32_t kMaxSteps = 40;
  const std::filesystem::path csv = std::filesystem::temp_directory_path() /
                                    ("gradsync-autotune-" + std::to_string(::getpid()) + ".csv");
  std::filesystem::remove(csv);
  daemon().stop();
  start_logged_daemon(poor_autotune_config(csv, kMaxSteps), {"--log-level", "info"});
  auto ranks = spawn_ranks("autotune", GetParam(), {"steps", "60", "24", "300000"}, {},
                           {{"GRADSYNC_AUTOTUNE", "1"}});
  expect_all_succeed(ranks);
  // The daemon logs what is left of a search when the job ends, which it may not have seen yet.
  settled_resources_of(daemon().process().pid(), socket());
  const std::string chosen = expect_autotune_trials(csv, kMaxSteps);
  std::filesystem::remove(csv);
  ASSERT_NE(chosen, "");
  EXPECT_NE(daemon_log().find("autotune chose " + chosen + " ("), std::string::npos)
      << daemon_log();
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

class MappingCacheTest : public DaemonTest {};

// The host mapping cache at its smallest: each rank's two buffers evict each other's mapping
// on every use, each maps again from the memfd the daemon kept, every result is right, and
// what the cache held (mappings and memfds) goes with the ranks.
TEST_F(MappingCacheTest, EvictedBuffersMapAgainAndStayRight) {
  start_daemon("host_mapping_cache_entries = 1", {"--metrics-listen", "127.0.0.1:0"});
  const uint16_t port = port_of(bound_addresses(socket()).metrics);
  const pid_t pid = daemon().process().pid();
  const DaemonResources baseline = settled_resources_of(pid, socket());
  auto ranks = spawn_ranks("evicting", 2, {"collectives"});
  expect_all_succeed(ranks);
  // Four registrations map once each; every other miss is a mapping made again.
  const std::string misses = "gradsync_mapping_cache_lookups_total{result=\"miss\"}";
  double missed = 0;
  for (int i = 0; i < 50 && missed <= 4; ++i) {
    missed = sample(scrape(port), misses);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(missed, 4) << "nothing was evicted and mapped again";
  expect_resources_return_to(baseline);
}

class HeapTest : public DaemonTest, public ::testing::WithParamInterface<int> {};

// A heap of the process serves two communicators with no registration, every result right;
// the arenas it lets go of are unregistered as they go (more of them than the daemon lets a
// client hold at once), and what the daemon held for them goes with the ranks.
TEST_P(HeapTest, TwoCommunicatorsShareItAndReleasedArenasAreUnregistered) {
  start_daemon("max_buffers_per_client = 3");
  const DaemonResources baseline = settled_resources_of(daemon().process().pid(), socket());
  auto ranks = spawn_ranks("heap", GetParam(), {"heap", "6"});
  expect_all_succeed(ranks);
  expect_resources_return_to(baseline);
}

INSTANTIATE_TEST_SUITE_P(LocalRanks, HeapTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

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
  // The owner's hello creates the job before the intruder asks to join it.
  ASSERT_TRUE(wait_for_local_ranks(daemon().socket_path(), "owned", 1, std::chrono::seconds(30)));
  auto intruder = spawn_rank("owned", 1, 2, {"join"}, {"--as-uid", "65534"});
  const auto status = intruder.wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status);
  EXPECT_EQ(*status, GRADSYNC_ERR_PERMISSION);
  // The job itself is untouched: its real rank 1 can still join.
  auto rank1 = spawn_rank("owned", 1, 2, {"join"});
  EXPECT_EQ(rank1.wait_for(std::chrono::seconds(30)), std::optional<int>(0));
}

// As installed: the socket is 0660 to the daemon's group (socket_group), and a uid outside
// it cannot even connect, while a member runs its job.
TEST(SocketAccess, OnlyTheSocketGroupMayConnect) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  const std::filesystem::path config = std::filesystem::temp_directory_path() /
                                       ("gradsync-socket-" + std::to_string(::getpid()) + ".toml");
  std::ofstream(config) << "socket_mode = 0o660\nsocket_group = \"adm\"\n";
  tools::PrivateDaemon daemon(tools::executable_dir() + "/gradsyncd", {"--config", config});
  std::filesystem::remove(config);
  struct stat status {};
  ASSERT_EQ(::stat(daemon.socket_path().c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 07777, 0660u);
  const struct group* adm = ::getgrnam("adm");
  ASSERT_NE(adm, nullptr);
  EXPECT_EQ(status.st_gid, adm->gr_gid);
  // The private directory around the socket is the test's; open it so only the mode counts.
  ::chmod(daemon.directory().c_str(), 0755);
  auto join_as = [&](const std::string& who) {
    return run_command(who + " env GRADSYNC_SOCKET=" + daemon.socket_path() +
                       " GRADSYNC_JOB=members RANK=0 WORLD_SIZE=1 " + tools::executable_dir() +
                       "/gradsync-test-rank join 2>&1");
  };
  const CommandResult outsider = join_as("setpriv --reuid 65534 --regid 65534 --clear-groups");
  EXPECT_NE(outsider.status, 0) << outsider.out;
  EXPECT_NE(outsider.out.find("ermission denied"), std::string::npos) << outsider.out;
  const CommandResult member = join_as("setpriv --reuid 65534 --regid 65534 --groups adm");
  EXPECT_EQ(member.status, 0) << member.out;
}

}  // namespace
}  // namespace gradsync::testing
