// Faults become errors within a bound, and leave nothing behind.
#include "tests/integration/harness.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
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
  // Killed once the job has formed and runs, so that the failure is the running job's.
  ASSERT_TRUE(
      wait_for_job_state(daemon().socket_path(), "again", "running", std::chrono::seconds(30)));
  ranks[0].signal(SIGKILL);
  ASSERT_EQ(ranks[1].wait_for(std::chrono::seconds(5)),
            std::optional<int>(GRADSYNC_ERR_PEER_FAILED));
  ranks[0].wait();
  auto next = spawn_ranks("again", 2, {"grouped"});
  expect_all_succeed(next);
}

// Jobs that are parts of another (gradsync_job_settings.parent_job): a rank lost to the whole
// job fails each part holding it within a bound, also one it never joined and one formed after
// it was lost, and a part of a part; the parts without it run on; and nothing stays behind.
TEST_F(FaultsTest, ARankLostToAJobFailsThePartsOfItThatHoldIt) {
  const DaemonResources baseline = resources_of(daemon().process().pid());
  auto ranks = spawn_ranks("whole", 3, {"parts_rank_lost"});
  expect_all_succeed(ranks, std::chrono::seconds(60));
  expect_resources_return_to(baseline);
}

// A rank that leaves the whole job with a goodbye fails no part of it; a rank that names
// another place in the whole job than the part's first rank did is refused.
TEST_F(FaultsTest, ARankLeavingAJobFailsNoPartOfItAndPartsMustAgreeOnTheirPlace) {
  auto ranks = spawn_ranks("whole", 2, {"parts_rank_left"});
  expect_all_succeed(ranks, std::chrono::seconds(60));
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

// 100 clients connect, run a job and leave, in a loop, two at a time, while a long job runs
// beside them: that job's results stay right, and the daemon's fds, shared-memory mappings and
// memory come back (memory within a bound: the allocator keeps some).
TEST_F(FaultsTest, HundredClientsComingAndGoingBesideARunningJob) {
  const pid_t pid = daemon().process().pid();
  auto rss_kib = [pid] {
    const CommandResult status =
        run_command("awk '/^VmRSS/ {print $2}' /proc/" + std::to_string(pid) + "/status");
    return std::stol(status.out);
  };
  // Warm the paths the loop takes once, so that the baseline holds what stays allocated.
  auto warm = spawn_ranks("warm", 2, {"grouped"});
  expect_all_succeed(warm);
  const DaemonResources baseline = settled_resources_of(pid, socket());
  const long rss_before = rss_kib();
  auto steady = spawn_ranks("steady", 2, {"steps", "400"});
  for (int round = 0; round < 50; ++round) {
    auto pair = spawn_ranks("churn-" + std::to_string(round), 2, {"grouped"});
    expect_all_succeed(pair);
  }
  expect_all_succeed(steady);
  expect_resources_return_to(baseline);
  EXPECT_LT(rss_kib() - rss_before, 32 * 1024) << "the daemon grew by more than 32 MiB";
}

// A client that submits and never reads its completions fills its completion ring. The daemon
// then takes no more of its submissions (it would have nowhere to answer them), loses none of
// its completions, and serves other jobs as before; once the client reads, the rest run.
TEST_F(DaemonTest, ClientThatNeverReadsCompletionsStallsOnlyItself) {
  constexpr uint64_t kRing = 16;
  start_daemon("ring_entries = " + std::to_string(kRing));
  RawClient hog(socket());
  ASSERT_EQ(hog.hello("hog", 0, 1).first, 0u);
  ipc::UniqueFd memfd = ipc::create_sealed_memfd("hog", 1 << 16);
  ASSERT_EQ(hog.register_buffer(1, memfd.get(), 0, 1 << 16).first, 0u);
  auto submit = [&](uint64_t request) {
    auto entry = allreduce_entry("t" + std::to_string(request), 1, 0, 1024);
    entry.request = request;
    hog.submit(entry);
  };
  for (uint64_t r = 0; r < kRing; ++r) submit(r);
  // The daemon takes these at once (its completions fill the ring): room for as many more.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (hog.submission_ring_free() < kRing && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(hog.submission_ring_free(), kRing);
  for (uint64_t r = kRing; r < 2 * kRing; ++r) submit(r);

  auto bystanders = spawn_ranks("bystander", 2, {"collectives"});
  expect_all_succeed(bystanders);
  EXPECT_EQ(hog.submission_ring_free(), 0u) << "the daemon took work it cannot answer";

  for (uint64_t r = 0; r < 2 * kRing; ++r) {
    const ipc::CompletionEntry done = hog.next_completion();
    EXPECT_EQ(done.request, r) << "a completion was lost";
    EXPECT_EQ(done.status, static_cast<uint32_t>(GRADSYNC_OK));
  }
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

// A daemon that dies as a rank joins (here: a socket that takes the connection and closes it
// unread, so that the rank reads a reset): the rank is told the daemon is gone, as it would be
// once joined, not that something inside it failed.
TEST(Joining, ADaemonThatDiesAsTheRankJoinsIsGone) {
  struct RemovedAtEnd {
    std::filesystem::path path;
    ~RemovedAtEnd() { std::filesystem::remove_all(path); }
  } const dir{std::filesystem::temp_directory_path() /
              ("gradsync-joining-" + std::to_string(::getpid()))};
  std::filesystem::create_directories(dir.path);
  const std::string path = (dir.path / "gradsyncd.sock").string();
  ipc::UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_GE(listener.get(), 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(address.sun_path));
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)),
            0);
  ASSERT_EQ(::listen(listener.get(), 1), 0);
  tools::ChildProcess rank(
      {tools::executable_dir() + "/gradsync-test-rank", "join"},
      {{"GRADSYNC_SOCKET", path}, {"GRADSYNC_JOB", "joining"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}});
  {
    const ipc::UniqueFd connection(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_GE(connection.get(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the hello waits unread
  }
  EXPECT_EQ(rank.wait_for(std::chrono::seconds(10)).value_or(-1), GRADSYNC_ERR_DAEMON_GONE);
}

}  // namespace
}  // namespace gradsync::testing
