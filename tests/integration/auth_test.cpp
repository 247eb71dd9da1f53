// Cluster authentication end to end: node daemons with the same key form jobs; a daemon with
// another key, or none, is refused by the others, logged and counted, and its job fails on
// every node with the reason instead of hanging; the refusing daemons go on serving jobs among
// themselves. A key file others could read stops the daemon from starting.
#include "tests/integration/harness.h"
#include "tests/integration/loopback_cluster.h"

#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace gradsync::testing {
namespace {

using ::testing::HasSubstr;

constexpr auto kRefusalBound = std::chrono::seconds(20);

struct Intruder {
  const char* name;
  std::string key;      // the last node's; "" for none
  const char* refusal;  // what node 0 logs about it
};

void PrintTo(const Intruder& intruder, std::ostream* out) {
  *out << intruder.name;
}

class IntruderTest : public ::testing::TestWithParam<Intruder> {};

TEST_P(IntruderTest, IsRefusedLoggedCountedAndItsJobFailsEverywhere) {
  const std::string shared = "the cluster key of the real nodes";
  LoopbackCluster cluster(3, "", true, {shared, shared, GetParam().key});
  auto ranks = cluster.spawn("intruded", {1, 1, 1}, {"steps", "1"});
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto status = ranks[r].wait_for(kRefusalBound);
    ASSERT_TRUE(status) << "rank " << r << " hung on a job with a node that was refused";
    EXPECT_EQ(*status, 100 + GRADSYNC_ERR_PEER_FAILED) << "rank " << r;
  }
  // The ranks can hear of the failure (from node 2, or in node 1's abort) before node 0 has
  // finished its own side of the handshakes, the refused one and node 1's to it: give node 0
  // the same bound to count them.
  const auto deadline = std::chrono::steady_clock::now() + kRefusalBound;
  auto counted = [&](const std::string& series, double at_least) {
    double value = 0;
    while ((value = sample(scrape(cluster.metrics_port()), series)) < at_least &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return value;
  };
  EXPECT_GE(counted("gradsync_peer_handshakes_total{result=\"refused\"}", 1.0), 1.0);
  EXPECT_GE(counted("gradsync_peer_handshakes_total{result=\"accepted\"}", 2.0), 2.0)
      << "node 0 and node 1 accepted each other both ways";
  const std::string log0 = cluster.log(0);
  EXPECT_THAT(log0, HasSubstr(cluster.address(2)));
  EXPECT_THAT(log0, HasSubstr(GetParam().refusal));
  EXPECT_THAT(log0, HasSubstr("job 'intruded' failed"));

  // Nodes 0 and 1 still hold each other's accepted connections and serve a job of their own.
  std::vector<tools::ChildProcess> pair;
  for (int node : {0, 1}) {
    pair.emplace_back(
        std::vector<std::string>{tools::executable_dir() + "/gradsync-test-rank", "collectives"},
        std::map<std::string, std::string>{
            {"GRADSYNC_SOCKET", cluster.daemon(node).socket_path()},
            {"GRADSYNC_JOB", "the-real-nodes"},
            {"GRADSYNC_NODES", cluster.address(0) + "," + cluster.address(1)},
            {"GRADSYNC_NODE_RANK", std::to_string(node)},
            {"RANK", std::to_string(node)},
            {"WORLD_SIZE", "2"},
            {"LOCAL_RANK", "0"},
            {"LOCAL_WORLD_SIZE", "1"}});
  }
  for (auto& rank : pair) {
    const auto status = rank.wait_for(std::chrono::seconds(120));
    ASSERT_TRUE(status);
    EXPECT_EQ(*status, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Keys, IntruderTest,
    ::testing::Values(Intruder{"AnotherKey", "the cluster key of somebody else",
                               "did not prove the cluster key"},
                      Intruder{"NoKey", "", "has no cluster key, and this one requires it"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Auth, DaemonsWithoutKeysAcceptEachOther) {
  LoopbackCluster cluster(2, "", false, {"", ""});
  auto ranks = cluster.spawn("keyless", {1, 1}, {"steps", "3"});
  for (auto& rank : ranks) {
    const auto status = rank.wait_for(std::chrono::seconds(120));
    ASSERT_TRUE(status);
    EXPECT_EQ(*status, 0);
  }
  EXPECT_THAT(cluster.log(0), HasSubstr("node daemons are not authenticated"));
}

TEST(Auth, AKeyFileOthersCanReadStopsTheDaemonFromStarting) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gradsync-auth-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path key = dir / "cluster.key";
  std::ofstream(key) << "a key that the whole machine can read\n";
  std::filesystem::permissions(key, std::filesystem::perms::owner_read |
                                        std::filesystem::perms::owner_write |
                                        std::filesystem::perms::others_read);
  const CommandResult result = run_command(
      "timeout 20 " + tools::executable_dir() + "/gradsyncd --socket " + (dir / "s.sock").string() +
      " --metrics-listen '' --listen 127.0.0.1:0 --cluster-key-file " + key.string() + " 2>&1");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(result.status, 1) << result.out;
  EXPECT_THAT(result.out, HasSubstr("mode 0604"));
  EXPECT_THAT(result.out, HasSubstr("chmod 600"));
}

}  // namespace
}  // namespace gradsync::testing
