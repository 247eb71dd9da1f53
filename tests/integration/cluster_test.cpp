// Several gradsyncd on one machine, one per "node", talking UCX over TCP on loopback, with
// real rank processes on each: the multi-node path end to end.
#include "tests/integration/harness.h"
#include "tests/integration/loopback_cluster.h"
#include "transport/mesh.h"

#include <gmock/gmock.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>

namespace gradsync::testing {
namespace {

// Every rank exits 0; where one does not, the daemons' logs say why (a sanitizer's report, a
// fatal error), which is all CI keeps of them.
void expect_all_succeed(std::vector<tools::ChildProcess>& children,
                        const LoopbackCluster& cluster) {
  bool all_succeeded = true;
  for (size_t r = 0; r < children.size(); ++r) {
    const auto status = children[r].wait_for(std::chrono::seconds(240));
    EXPECT_TRUE(status) << "rank " << r << " did not finish";
    EXPECT_EQ(status.value_or(-1), 0) << "rank " << r << " failed";
    all_succeeded &= status == 0;
  }
  if (all_succeeded) return;
  for (int node = 0; node < cluster.nodes(); ++node) {
    ADD_FAILURE() << "node " << node << "'s daemon logged:\n" << cluster.log(node);
  }
}

// Kills node `node`'s daemon with SIGKILL once the ranks (one per node, rank n on node n) are
// under way: every rank ends within 10 s, the dead node's told its daemon is gone, every other
// one that a peer failed.
void kill_daemon_and_expect_every_rank_fails(LoopbackCluster& cluster,
                                             std::vector<tools::ChildProcess>& ranks, int node) {
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  cluster.daemon(node).process().signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto status = ranks[r].wait_for(std::chrono::seconds(10));
    ASSERT_TRUE(status) << "rank " << r << " hung after node " << node << "'s daemon died";
    EXPECT_EQ(*status,
              r == static_cast<size_t>(node) ? GRADSYNC_ERR_DAEMON_GONE : GRADSYNC_ERR_PEER_FAILED)
        << "rank " << r;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(10));
}

struct Shape {
  int nodes;
  int ranks_per_node;
};

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  return std::to_string(info.param.nodes) + "nodes_" + std::to_string(info.param.ranks_per_node) +
         "ranks";
}

class ClusterTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ClusterTest, EveryCollectiveDtypeOpAndCountAcrossNodes) {
  LoopbackCluster cluster(GetParam().nodes);
  auto ranks = cluster.spawn(
      "cluster", std::vector<int>(static_cast<size_t>(GetParam().nodes), GetParam().ranks_per_node),
      {"cluster"});
  expect_all_succeed(ranks, cluster);
  for (int n = 0; n < cluster.nodes(); ++n) {
    EXPECT_EQ(cluster.daemon(n).stop(), 0);
    // Ranks that leave once their work is done end the job on every node; nothing failed.
    EXPECT_THAT(cluster.log(n), ::testing::Not(::testing::HasSubstr("' failed:"))) << "node " << n;
  }
}

TEST_P(ClusterTest, PrioritiesInFlightTogetherAcrossNodes) {
  LoopbackCluster cluster(GetParam().nodes);
  auto ranks = cluster.spawn(
      "priorities",
      std::vector<int>(static_cast<size_t>(GetParam().nodes), GetParam().ranks_per_node),
      {"priorities"});
  expect_all_succeed(ranks, cluster);
}

// Autotune across nodes (docs/autotune.md): node 0 searches from a poor configuration, every
// node runs each candidate from the cycle node 0 announces it in, and every node ends with node
// 0's choice, within the step bound; every step's results are exact throughout.
class AutotuneClusterTest : public ::testing::TestWithParam<Shape> {};

TEST_P(AutotuneClusterTest, EndsWithNodeZerosChoiceOnEveryNode) {
  constexpr uint32_t kMaxSteps = 40;
  const std::filesystem::path csv = std::filesystem::temp_directory_path() /
                                    ("gradsync-autotune-" + std::to_string(::getpid()) + ".csv");
  std::filesystem::remove(csv);
  LoopbackCluster cluster(GetParam().nodes, poor_autotune_config(csv, kMaxSteps), false, {},
                          {"--log-level", "info"});
  auto ranks = cluster.spawn(
      "autotune",
      std::vector<int>(static_cast<size_t>(GetParam().nodes), GetParam().ranks_per_node),
      {"steps", "60", "24", "300000"}, {{"GRADSYNC_AUTOTUNE", "1"}});
  expect_all_succeed(ranks, cluster);
  // A daemon logs what is left of a search when the job ends, which it may not have seen yet.
  for (int n = 0; n < cluster.nodes(); ++n) EXPECT_EQ(cluster.daemon(n).stop(), 0);
  const std::string chosen = expect_autotune_trials(csv, kMaxSteps);
  std::filesystem::remove(csv);
  ASSERT_NE(chosen, "");
  EXPECT_THAT(cluster.log(0), ::testing::HasSubstr("autotune chose " + chosen + " ("));
  for (int n = 1; n < cluster.nodes(); ++n) {
    EXPECT_THAT(cluster.log(n), ::testing::HasSubstr("autotune: node 0 chose " + chosen + "\n"))
        << "node " << n;
  }
}

// What differs between shapes (the negotiation's routes, fusion across ranks) the other cluster
// tests cover. Under the sanitizers some shapes are left out (tests/integration/CMakeLists.txt).
INSTANTIATE_TEST_SUITE_P(Shapes, AutotuneClusterTest, ::testing::Values(Shape{2, 1}, Shape{4, 1}),
                         shape_name);

INSTANTIATE_TEST_SUITE_P(Shapes, ClusterTest,
                         ::testing::Values(Shape{2, 1}, Shape{2, 2}, Shape{3, 1}, Shape{3, 2},
                                           Shape{4, 1}),
                         shape_name);

// A job's name taken again at once, as an elastic restart or a script's next run does: each
// instance forms and runs on every node, whatever the last one's final messages (its aborts as
// its ranks leave) say when they arrive (internode.capnp, incarnation).
TEST(JobNameTakenAgain, EachInstanceFormsAndRunsOnEveryNode) {
  LoopbackCluster cluster(2, "job_formation_timeout_seconds = 20\npeer_timeout_seconds = 10");
  for (int instance = 0; instance < 30 && !::testing::Test::HasFailure(); ++instance) {
    SCOPED_TRACE("instance " + std::to_string(instance));
    auto ranks = cluster.spawn("taken-again", {1, 1}, {"steps", "3", "8", "1000"});
    expect_all_succeed(ranks, cluster);
  }
}

// Each inter-node allreduce forced, on node counts that are and are not powers of two.
struct ForcedAlgorithm {
  std::string algorithm;
  Shape shape;
};

std::string forced_algorithm_name(const ::testing::TestParamInfo<ForcedAlgorithm>& info) {
  return info.param.algorithm + "_" + std::to_string(info.param.shape.nodes) + "nodes_" +
         std::to_string(info.param.shape.ranks_per_node) + "ranks";
}

// A job of test_rank's `args` on every rank of the shape, with the algorithm forced.
void expect_forced_job_succeeds(const ForcedAlgorithm& forced, const std::string& job,
                                const std::vector<std::string>& args) {
  LoopbackCluster cluster(forced.shape.nodes);
  auto ranks = cluster.spawn(
      job, std::vector<int>(static_cast<size_t>(forced.shape.nodes), forced.shape.ranks_per_node),
      args, {{"GRADSYNC_ALGO", forced.algorithm}});
  expect_all_succeed(ranks, cluster);
}

class AlgorithmTest : public ::testing::TestWithParam<ForcedAlgorithm> {};

TEST_P(AlgorithmTest, EveryDtypeOpAndCountIsRight) {
  expect_forced_job_succeeds(GetParam(), "forced", {"cluster"});
}

std::vector<ForcedAlgorithm> forced_algorithms() {
  return {{"rhd", {2, 1}}, {"rhd", {3, 2}},  {"rhd", {4, 1}},
          {"rhd", {5, 1}}, {"ring", {5, 1}}, {"direct", {3, 2}}};
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AlgorithmTest, ::testing::ValuesIn(forced_algorithms()),
                         forced_algorithm_name);

// GRADSYNC_ALGO=direct: every float sum is the same bits, the nodes' sums added in node order,
// whether the tensors fuse, go one by one or come in another order (node_direct_allreduce.cpp).
class NodeOrderTest : public ::testing::TestWithParam<Shape> {};

TEST_P(NodeOrderTest, DirectAllreducesAddInNodeOrderWhateverTheFusion) {
  expect_forced_job_succeeds(ForcedAlgorithm{"direct", GetParam()}, "node_order", {"node_order"});
}

INSTANTIATE_TEST_SUITE_P(Shapes, NodeOrderTest, ::testing::Values(Shape{3, 1}, Shape{3, 2}),
                         shape_name);

// Tensors large enough to be pipelined in pieces, with each algorithm forced: the pieces' cut,
// the overlap of one step's pieces with the next, and each node's share of a count no node
// count divides.
class PipelinedTest : public ::testing::TestWithParam<ForcedAlgorithm> {};

TEST_P(PipelinedTest, LargeAllreducesAreRight) {
  // 6 Mi + 7 floats: 24 MiB, 2 or 3 pieces of each node's share (kPipelinePieceBytes).
  expect_forced_job_succeeds(GetParam(), "large", {"large", std::to_string((6u << 20) + 7)});
}

INSTANTIATE_TEST_SUITE_P(Algorithms, PipelinedTest,
                         ::testing::Values(ForcedAlgorithm{"ring", {2, 1}},
                                           ForcedAlgorithm{"ring", {3, 2}},
                                           ForcedAlgorithm{"rhd", {3, 1}},
                                           ForcedAlgorithm{"direct", {3, 1}}),
                         forced_algorithm_name);

// The bf16 wire codec on the ring, asked for by the job: pipelined in pieces, over a count no
// node count divides, on 2 and 3 nodes (3: a partial sum is encoded, decoded and reduced at
// every hop). The other dtypes of the same job travel as they are, and stay exact.
class WireCodecTest : public ::testing::TestWithParam<Shape> {};

TEST_P(WireCodecTest, EncodedAllreducesAreCloseAndTheSameOnEveryRank) {
  LoopbackCluster cluster(GetParam().nodes);
  auto ranks = cluster.spawn(
      "encoded", std::vector<int>(static_cast<size_t>(GetParam().nodes), GetParam().ranks_per_node),
      {"encoded", std::to_string((6u << 20) + 5)},
      {{"GRADSYNC_ALGO", "ring"}, {"GRADSYNC_WIRE_CODEC", "bf16"}});
  expect_all_succeed(ranks, cluster);
}

INSTANTIATE_TEST_SUITE_P(Shapes, WireCodecTest, ::testing::Values(Shape{2, 1}, Shape{3, 2}),
                         shape_name);

// The top-k wire codec, asked for by the job: steps of two tensors (fused or not) whose results
// and held-back remainders follow the reference's, on 2 and 3 nodes with 1 and 2 ranks each;
// the job's other allreduces stay exact.
class TopKCodecTest : public ::testing::TestWithParam<Shape> {};

TEST_P(TopKCodecTest, SparseAllreducesFollowTheReference) {
  LoopbackCluster cluster(GetParam().nodes);
  auto ranks = cluster.spawn(
      "topk", std::vector<int>(static_cast<size_t>(GetParam().nodes), GetParam().ranks_per_node),
      {"topk", "25"}, {{"GRADSYNC_WIRE_CODEC", "topk:25"}});
  expect_all_succeed(ranks, cluster);
}

INSTANTIATE_TEST_SUITE_P(Shapes, TopKCodecTest, ::testing::Values(Shape{2, 1}, Shape{3, 2}),
                         shape_name);

// The same training-shaped steps through a warm response cache, through one too small for the
// step (entries evicted and renegotiated all the time), and with no cache at all: every result
// is checked against the reference.
class ResponseCacheTest : public ::testing::TestWithParam<int> {};

TEST_P(ResponseCacheTest, ManyStepsOfTheSameNamesAreRight) {
  LoopbackCluster cluster(3, "response_cache_capacity = " + std::to_string(GetParam()));
  auto ranks = cluster.spawn("steps", {2, 1, 1}, {"steps", "30"});
  expect_all_succeed(ranks, cluster);
}

INSTANTIATE_TEST_SUITE_P(Capacities, ResponseCacheTest, ::testing::Values(1024, 5, 0),
                         [](const auto& info) { return "capacity" + std::to_string(info.param); });

// Negotiation cycles relayed by recursive doubling (forced from 2 nodes; jobs of 8 and more
// relay by default): every collective on a node count that is no power of two (node 4 hands
// its part to node 0 and gets the rest back), training-shaped steps on one that is, counting
// node 0's messages, and many steps with a cache small enough to evict and renegotiate all the
// time, by every node's reports.
TEST(Cluster, EveryCollectiveIsRightWithRelayedNegotiation) {
  {
    // 5 nodes, no power of two: node 4 hands its part to node 0.
    LoopbackCluster cluster(5, "negotiation_relay_min_nodes = 2");
    auto ranks = cluster.spawn("relayed", {1, 1, 1, 1, 1}, {"cluster"});
    expect_all_succeed(ranks, cluster);
  }
  {
    // Of 4 nodes, node 0 sends two messages a cycle (hops to nodes 1 and 2), not three; the
    // job's last cycle may have ended before node 0 sent all of its part.
    LoopbackCluster cluster(4, "negotiation_relay_min_nodes = 2", true);
    auto ranks = cluster.spawn("relayed_hops", {1, 1, 1, 1}, {"steps", "20"});
    expect_all_succeed(ranks, cluster);
    const std::string text = scrape(cluster.metrics_port());
    const double cycles = sample(text, "gradsync_negotiation_cycles_total");
    const double messages = sample(text, "gradsync_negotiation_messages_total");
    EXPECT_GT(cycles, 10) << text;
    EXPECT_LE(messages, 2 * cycles);
    EXPECT_GE(messages, 2 * cycles - 2);
  }
  LoopbackCluster cluster(4, "negotiation_relay_min_nodes = 2\nresponse_cache_capacity = 5");
  auto ranks = cluster.spawn("relayed_steps", {2, 1, 1, 1}, {"steps", "30"});
  expect_all_succeed(ranks, cluster);
}

// The default configuration relays from 8 nodes (negotiation_relay_min_nodes): node 0 of 8
// sends its part on 3 hops a cycle (to nodes 1, 2 and 4), not to 7 nodes, and nothing more for
// the cycles with names new to the response cache.
TEST(Cluster, JobsOfEightNodesRelayTheirCyclesByDefault) {
  LoopbackCluster cluster(8, "", true);
  auto ranks = cluster.spawn("eight_nodes", std::vector<int>(8, 1), {"steps", "5", "8", "4096"});
  expect_all_succeed(ranks, cluster);
  const std::string text = scrape(cluster.metrics_port());
  const double cycles = sample(text, "gradsync_negotiation_cycles_total");
  const double messages = sample(text, "gradsync_negotiation_messages_total");
  EXPECT_GT(cycles, 4) << text;
  EXPECT_LE(messages, 3 * cycles);
  EXPECT_GE(messages, 3 * cycles - 3);  // the job's last cycle may end before all three hops
  // The first step's names were new; the later steps' come from the cache.
  EXPECT_GT(sample(text, "gradsync_negotiation_cache_total{result=\"miss\"}"), 0);
  EXPECT_GT(sample(text, "gradsync_negotiation_cache_total{result=\"hit\"}"), 0);
}

// A job's two groups, each a job of its own: the node's (one node) and, per local rank, the one
// across nodes. An allreduce in the first, then in the second, is the job's allreduce.
TEST(Cluster, ANodesGroupThenItsAcrossNodesGroupMakeTheJobsAllreduce) {
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("hier", {2, 2}, {"groups"});
  expect_all_succeed(ranks, cluster);
}

// A heap of the process serves a job across nodes and its node's group without registration,
// and the arenas it lets go of are unregistered (HeapTest on one node).
TEST(Cluster, AHeapOfTheProcessServesTheJobAcrossNodes) {
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("heap", {2, 2}, {"heap", "3"});
  expect_all_succeed(ranks, cluster);
}

// Hundreds of small tensors ready at once: more than one cycle message may carry (names and
// contributions), so negotiation spreads them over several cycles.
TEST(Cluster, HundredsOfSmallTensorsPerStep) {
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("small", {1, 2}, {"steps", "4", "1000", "1000"});
  expect_all_succeed(ranks, cluster);
}

// Short jobs whose ranks leave the moment their last collective completes: a node that
// completed it tells the others it ended the job, and one that has yet to hear another node's
// part of the cycle that decided it must complete that cycle first, not fail what its ranks
// still wait for (the messages of different nodes travel on different connections).
TEST(Cluster, RanksThatLeaveAfterTheirLastCollectiveFailNoOtherRank) {
  LoopbackCluster cluster(4);
  for (int job = 0; job < 20; ++job) {
    auto ranks =
        cluster.spawn("leave" + std::to_string(job), {1, 1, 1, 1}, {"steps", "2", "4", "4"});
    expect_all_succeed(ranks, cluster);
    if (::testing::Test::HasFailure()) break;
  }
}

// Runs test_rank's `scenario` on every rank of `shape`, each result checked against the
// reference, and expects node 0's metrics to show fused batches (one rank per node: no local
// batches to confuse them).
void expect_job_fuses(const Shape& shape, const std::string& scenario,
                      const std::map<std::string, std::string>& env = {}) {
  LoopbackCluster cluster(shape.nodes, "", true);
  auto ranks = cluster.spawn(
      scenario, std::vector<int>(static_cast<size_t>(shape.nodes), shape.ranks_per_node),
      {scenario}, env);
  expect_all_succeed(ranks, cluster);
#ifndef GRADSYNC_SANITIZED
  // Fusion needs tensors decided in one cycle; instrumented, the nodes are slow enough that
  // each may arrive alone (every result is still checked above).
  if (shape.ranks_per_node == 1) {
    const std::string text = scrape(cluster.metrics_port());
    EXPECT_GT(sample(text, "gradsync_fusion_batch_tensors_count"), 0) << text;
  }
#endif
}

// Allreduces of every dtype and op in flight together: the nodes fuse the runs of one dtype and
// op that a cycle decides, and cut them where either changes.
class MixedFusionTest : public ::testing::TestWithParam<Shape> {};

TEST_P(MixedFusionTest, RunsOfOneDtypeAndOpFuseAndStayRight) {
  expect_job_fuses(GetParam(), "mixed");
}

INSTANTIATE_TEST_SUITE_P(Shapes, MixedFusionTest,
                         ::testing::Values(Shape{2, 1}, Shape{3, 2}, Shape{4, 1}), shape_name);

// Tensors from a few floats to megabytes decided together, with halving-doubling forced: the
// small ones fuse packed, the large ones in place (a message per tensor and level), on node
// counts that are and are not powers of two.
class InPlaceFusionTest : public ::testing::TestWithParam<Shape> {};

TEST_P(InPlaceFusionTest, TensorsOfEverySizeFuseAndStayRight) {
  expect_job_fuses(GetParam(), "fused_sizes", {{"GRADSYNC_ALGO", "rhd"}});
}

INSTANTIATE_TEST_SUITE_P(Shapes, InPlaceFusionTest,
                         ::testing::Values(Shape{2, 1}, Shape{3, 2}, Shape{4, 1}), shape_name);

TEST(Cluster, MetricsShowTheMeasuredLinkTheCacheAndTheAlgorithms) {
  LoopbackCluster cluster(2, "", true);
  auto ranks = cluster.spawn("metrics", {1, 1}, {"steps", "10"});
  expect_all_succeed(ranks, cluster);
  const std::string text = scrape(cluster.metrics_port());
  ASSERT_FALSE(text.empty()) << "no answer from node 0's metrics endpoint";
  const std::string peer = cluster.addresses().substr(cluster.addresses().find(',') + 1);
  EXPECT_GT(sample(text, "gradsync_peer_latency_seconds{peer=\"" + peer + "\"}"), 0) << text;
  EXPECT_GT(sample(text, "gradsync_peer_bandwidth_bytes_per_second{peer=\"" + peer + "\"}"), 0);
  // 24 names: the first step through node 0, the other 9 from the cache.
  EXPECT_EQ(sample(text, "gradsync_negotiation_cache_total{result=\"miss\"}"), 24);
  EXPECT_EQ(sample(text, "gradsync_negotiation_cache_total{result=\"hit\"}"), 9 * 24);
  EXPECT_GT(sample(text, "gradsync_negotiation_cycles_total"), 0);
  EXPECT_GT(sample(text, "gradsync_internode_allreduces_total{algorithm=\"ring\"}"), 0);
  // Every tensor of every step completed on node 0: small ones with the negotiation, the
  // rest by an algorithm across nodes.
  double completed = 0;
  for (const std::string algorithm : {"negotiation", "ring", "rhd"}) {
    const double value = sample(text, "gradsync_collectives_completed_total{algorithm=\"" +
                                          algorithm + "\",op=\"allreduce\"}");
    completed += std::max(0.0, value);  // -1: no such series
  }
  EXPECT_EQ(completed, 10 * 24);
}

// Node 0's count of collectives of `op` completed by `algorithm` (0 where none went that way).
double completed_by(const std::string& metrics, const std::string& algorithm,
                    const std::string& op) {
  return std::max(0.0, sample(metrics, "gradsync_collectives_completed_total{algorithm=\"" +
                                           algorithm + "\",op=\"" + op + "\"}"));
}

// Runs `scenario` for `steps` steps on 3 nodes with ranks per node that differ (the node with
// two reduces or packs two ranks' blocks before anything leaves, the others send straight from
// their one rank's buffer), every result checked by the ranks, named or (with `unnamed`) not;
// returns node 0's metrics.
std::string run_small_and_large(const std::string& scenario, const std::vector<int>& ranks_per_node,
                                int steps, bool unnamed) {
  LoopbackCluster cluster(3, "", true);
  std::vector<std::string> args = {scenario, std::to_string(steps)};
  if (unnamed) args.emplace_back("unnamed");
  auto ranks = cluster.spawn(scenario, ranks_per_node, args);
  expect_all_succeed(ranks, cluster);
  return scrape(cluster.metrics_port());
}

// A small collective piggybacks on the negotiation from its first step on: its data comes with
// its name's report where the name is new to the response cache (every step, unnamed: the
// client's names for unnamed collectives are never cached), with its bit once it is cached.
class SmallCollectives : public ::testing::TestWithParam<bool> {
 protected:
  static bool unnamed() { return GetParam(); }
};

// A small allgather's blocks: each node's with its part of the cycle, every node placing them
// by the rank map (node 0's part holds two blocks); the large ones go over the network.
TEST_P(SmallCollectives, AllgathersRideWithTheNegotiation) {
  constexpr int kSteps = 6;
  const std::string text = run_small_and_large("allgathers", {2, 1, 1}, kSteps, unnamed());
  // Two small ones a step, and two large (out of place and in place) over the network.
  EXPECT_EQ(completed_by(text, "negotiation", "allgather"), 2 * kSteps) << text;
  EXPECT_EQ(completed_by(text, "direct", "allgather"), 2 * kSteps);
  EXPECT_EQ(sample(text, "gradsync_negotiation_cache_total{result=\"hit\"}"),
            unnamed() ? 0 : 4 * (kSteps - 1));
}

// One small reduce-scatter or all-to-all a step, with the cycle; `large` a step direct between
// the nodes.
void expect_small_piggybacked_large_direct(const char* scenario, const char* op, int large,
                                           bool unnamed) {
  constexpr int kSteps = 4;
  const std::string text = run_small_and_large(scenario, {2, 1, 1}, kSteps, unnamed);
  EXPECT_EQ(completed_by(text, "negotiation", op), kSteps) << text;
  EXPECT_EQ(completed_by(text, "direct", op), large * kSteps) << text;
}

TEST_P(SmallCollectives, ReduceScattersAreRightWithUnevenRanksPerNode) {
  expect_small_piggybacked_large_direct("reduce_scatters", "reduce_scatter", 2, unnamed());
}

TEST_P(SmallCollectives, AllToAllsAreRightWithUnevenRanksPerNode) {
  // The empty one goes the network's way too (it moves nothing).
  expect_small_piggybacked_large_direct("alltoalls", "alltoall", 2, unnamed());
}

// Small broadcasts from every root: the root's data with its node's part of the cycle; the
// large ones over the network.
TEST_P(SmallCollectives, BroadcastsRideWithTheNegotiation) {
  constexpr int kSteps = 4;
  constexpr int kRanks = 4;
  const std::string text = run_small_and_large("small_broadcasts", {1, 2, 1}, kSteps, unnamed());
  EXPECT_EQ(completed_by(text, "negotiation", "broadcast"), 2 * kRanks * kSteps) << text;
  EXPECT_EQ(completed_by(text, "direct", "broadcast") + completed_by(text, "chain", "broadcast"),
            kRanks * kSteps);
}

// Node 0's samples of what `job` holds in scratch (gradsync_job_scratch_bytes), every 50 ms
// from when its series appears until it goes (the job ended), for at most a minute.
std::vector<double> scratch_samples(LoopbackCluster& cluster, const std::string& job) {
  std::vector<double> samples;
  const std::string series = "gradsync_job_scratch_bytes{training_job=\"" + job + "\"}";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    const double bytes = sample(scrape(cluster.metrics_port()), series);
    if (bytes < 0 && !samples.empty()) break;
    if (bytes >= 0) samples.push_back(bytes);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return samples;
}

// Reduce-scatters of many small pieces (a node's blocks in about 90 to 280 of them, against
// a window of four in flight): every piece goes through every slot many times, over UCX, with
// uneven ranks per node. Node 0's daemon says what the job holds: what measured its links (2
// MiB) and four pieces from and for each other node, not the 24 MB a whole exchange would.
TEST(Cluster, LargeReduceScattersInSmallPiecesAreRight) {
  constexpr uint64_t kPieceBytes = 65536;
  LoopbackCluster cluster(3, "pipeline_piece_bytes = " + std::to_string(kPieceBytes), true);
  // The ranks stay 1.5 s once done: the daemon samples its jobs' figures every second.
  auto ranks = cluster.spawn("rs-pieces", {2, 1, 1}, {"reduce_scatters", "2", "named", "1500"});
  const std::vector<double> samples = scratch_samples(cluster, "rs-pieces");
  expect_all_succeed(ranks, cluster);
  const double held = samples.empty() ? -1 : *std::max_element(samples.begin(), samples.end());
  constexpr double kProbeBytes = 2 << 20;
  EXPECT_GT(held, kProbeBytes) << "no sample of the job's scratch after its reduce-scatters";
  // Four pieces from and for each of the 2 other nodes.
  EXPECT_LE(held, kProbeBytes + static_cast<double>(kPieceBytes * 2 * 2 * 4));
}

// Staging memory that none of a job's collectives has used for scratch_unused_seconds is freed
// while the job lives: node 0's daemon says the job holds some after its reduce-scatters (and
// what measured its links), then none while its ranks sit idle, before they leave.
TEST(Cluster, StagingMemoryUnusedForAWhileIsFreed) {
  LoopbackCluster cluster(2, "pipeline_piece_bytes = 65536\nscratch_unused_seconds = 1", true);
  // The ranks stay 5 s once done: the daemon frees and samples once a second.
  auto ranks = cluster.spawn("rs-idle", {1, 1}, {"reduce_scatters", "2", "named", "5000"});
  const std::vector<double> samples = scratch_samples(cluster, "rs-idle");
  expect_all_succeed(ranks, cluster);
  double held = 0;
  bool freed = false;
  for (const double bytes : samples) {
    held = std::max(held, bytes);
    freed = freed || (held > 0 && bytes == 0);
  }
  EXPECT_GT(held, 0) << "no sample of the job's scratch after its reduce-scatters";
  EXPECT_TRUE(freed) << "the job still held " << held << " bytes after idling 5 s";
}

INSTANTIATE_TEST_SUITE_P(Names, SmallCollectives, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Unnamed" : "Named"; });

TEST(Cluster, AControlMessageThatCannotBeReadFailsItsJob) {
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("garbled", {1, 1}, {"steps", "1"}, {}, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // node 0's job exists
  // Posing as node 1 (with the cluster's key: what a buggy daemon could send): a control-kind
  // tag for this job, and bytes that are no message.
  transport::MeshOptions options{"127.0.0.1:0"};
  options.cluster_key = transport::ClusterKey::load(cluster.key_file(1));
  transport::Mesh mesh(options);
  const transport::PeerId peer = mesh.connect(cluster.address(0));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!mesh.authenticated(peer) && std::chrono::steady_clock::now() < deadline) mesh.progress();
  ASSERT_TRUE(mesh.authenticated(peer)) << mesh.failure(peer);
  const uint64_t job_hash = std::hash<std::string>{}("garbled") & 0xffffu;
  const uint64_t tag = (uint64_t{1} << 56) | (uint64_t{1} << 48) | (job_hash << 32);
  const std::vector<uint8_t> garbage(64, 0xff);
  transport::Operation send = mesh.send(peer, tag, garbage.data(), garbage.size());
  while (!send.done() && std::chrono::steady_clock::now() < deadline) mesh.progress();
  ASSERT_TRUE(send.done());
  const auto status = ranks[0].wait_for(std::chrono::seconds(20));
  ASSERT_TRUE(status) << "the rank waited on although its job can no longer agree";
  EXPECT_EQ(*status, 100 + GRADSYNC_ERR_PROTOCOL);
}

TEST(Cluster, ANodeThatNeverJoinsFailsTheJobAfterTheFormationTimeout) {
  LoopbackCluster cluster(2, "job_formation_timeout_seconds = 2");
  // Only node 0's rank starts; node 1's daemon is up, but its rank never comes.
  auto ranks = cluster.spawn("lonely", {1, 1}, {"steps", "1"}, {}, 0);
  ASSERT_EQ(ranks.size(), 1u);
  const auto status = ranks[0].wait_for(std::chrono::seconds(20));
  ASSERT_TRUE(status) << "node 0's rank hung waiting for node 1";
  EXPECT_EQ(*status, 100 + GRADSYNC_ERR_TIMEOUT);
}

TEST(Cluster, RanksPerNodeMayDiffer) {
  LoopbackCluster cluster(3);
  auto ranks = cluster.spawn("uneven", {1, 3, 2}, {"grouped"});
  expect_all_succeed(ranks, cluster);
}

// Large broadcasts from every root, on nodes with different numbers of ranks: along a chain
// that starts at the root's node, as node 0's metrics count them; on 2 nodes, direct.
TEST(Cluster, LargeBroadcastsGoAlongAChainFromEveryRoot) {
  LoopbackCluster cluster(3, "", true);
  // 3 Mi + 5 floats: 12 MiB, 3 pieces; roots on every node, the chain's first, middle and last.
  auto ranks = cluster.spawn("chain", {1, 2, 1}, {"broadcasts", std::to_string((3u << 20) + 5)});
  expect_all_succeed(ranks, cluster);
  const std::string text = scrape(cluster.metrics_port());
  EXPECT_EQ(
      sample(text, "gradsync_collectives_completed_total{algorithm=\"chain\",op=\"broadcast\"}"),
      4 * 2)
      << text;
}

TEST(Cluster, BroadcastsBetweenTwoNodesGoDirect) {
  LoopbackCluster cluster(2, "", true);
  auto ranks = cluster.spawn("pair", {2, 1}, {"broadcasts", std::to_string((3u << 20) + 5)});
  expect_all_succeed(ranks, cluster);
  const std::string text = scrape(cluster.metrics_port());
  EXPECT_EQ(
      sample(text, "gradsync_collectives_completed_total{algorithm=\"direct\",op=\"broadcast\"}"),
      3 * 2)
      << text;
}

// Every broadcast along the chain (the ring forced): sizes down to one element, roots on
// every node.
TEST(Cluster, EveryCollectiveIsRightWithBroadcastsAlongTheChain) {
  LoopbackCluster cluster(4, "", true);
  auto ranks =
      cluster.spawn("forced_chain", {1, 1, 1, 1}, {"cluster"}, {{"GRADSYNC_ALGO", "ring"}});
  expect_all_succeed(ranks, cluster);
  const std::string text = scrape(cluster.metrics_port());
  EXPECT_GT(
      sample(text, "gradsync_collectives_completed_total{algorithm=\"chain\",op=\"broadcast\"}"), 0)
      << text;
  EXPECT_LE(
      sample(text, "gradsync_collectives_completed_total{algorithm=\"direct\",op=\"broadcast\"}"),
      0)
      << "no broadcast went direct (-1: no such series)";
}

// Two nodes' ranks with one RANK: an error for every rank that says so, before any collective
// runs with the wrong ranks.
TEST(Cluster, ARankOnTwoNodesIsAnErrorNamingIt) {
  LoopbackCluster cluster(2);
  auto first = cluster.spawn("twice", {1, 1}, {"steps", "1"}, {{"RANK", "0"}}, 0);
  auto second = cluster.spawn("twice", {1, 1}, {"steps", "1"}, {{"RANK", "0"}}, 1);
  for (auto* rank : {&first.at(0), &second.at(0)}) {
    const auto status = rank->wait_for(std::chrono::seconds(20));
    ASSERT_TRUE(status) << "a rank waited on a job whose ranks cannot be right";
    EXPECT_EQ(*status, 100 + GRADSYNC_ERR_INVALID_ARGUMENT);
  }
  for (int n = 0; n < cluster.nodes(); ++n) {
    EXPECT_THAT(cluster.log(n), ::testing::HasSubstr("rank 0 is on node 0 and on node 1"))
        << "node " << n;
  }
}

TEST(Cluster, MismatchAcrossNodesIsAnErrorForEveryRank) {
  // The last rank (on the last node) submits a different count.
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("mismatch", {1, 1}, {"mismatch"});
  expect_all_succeed(ranks, cluster);
}

TEST(Cluster, KilledPeerDaemonFailsSurvivingRanksWithinTenSeconds) {
  LoopbackCluster cluster(3);
  auto ranks = cluster.spawn("victim", {1, 1, 1}, {"loop", std::to_string(1 << 20)});
  ASSERT_NO_FATAL_FAILURE(kill_daemon_and_expect_every_rank_fails(cluster, ranks, 2));
  // The survivors keep serving other jobs.
  std::vector<tools::ChildProcess> after;
  for (int node : {0, 1}) {
    after.emplace_back(
        std::vector<std::string>{tools::executable_dir() + "/gradsync-test-rank", "grouped"},
        std::map<std::string, std::string>{{"GRADSYNC_SOCKET", cluster.daemon(node).socket_path()},
                                           {"GRADSYNC_JOB", "after"},
                                           {"RANK", "0"},
                                           {"WORLD_SIZE", "1"}});
  }
  expect_all_succeed(after, cluster);
}

// Relayed, node 0 never talks to node 3 in a cycle of 4 nodes (its partners are 1 and 2):
// small allreduces, which piggyback on the cycles, still fail everywhere within the bound when
// node 3's daemon dies.
TEST(Cluster, APeerKilledUnderRelayedNegotiationFailsEveryOtherRankWithinTenSeconds) {
  LoopbackCluster cluster(4, "negotiation_relay_min_nodes = 2");
  auto ranks = cluster.spawn("relay_victim", {1, 1, 1, 1}, {"loop", "8"});
  kill_daemon_and_expect_every_rank_fails(cluster, ranks, 3);
}

// A rank SIGKILLed in the middle of training-shaped steps, on one node of three: every other
// rank, on every node, gets an error within a bound, and the next job on the same daemons runs
// right. Repeated, since where the kill lands (negotiation, transfer, between steps) varies.
// The middle of a broadcast's chain (0 -> 1 -> 2) dies: node 2, which waits on a live node's
// receive, hears of it too.
TEST(Cluster, ADaemonKilledMidChainBroadcastFailsEveryOtherRankWithinTenSeconds) {
  LoopbackCluster cluster(3);
  // 16 MiB: 4 pieces along the chain.
  auto ranks =
      cluster.spawn("chain_victim", {1, 1, 1}, {"loop_broadcast", std::to_string(16 << 20)},
                    {{"GRADSYNC_ALGO", "ring"}});
  kill_daemon_and_expect_every_rank_fails(cluster, ranks, 1);
}

TEST(Cluster, ARankKilledMidStepFailsEveryOtherRankOnEveryNode) {
  LoopbackCluster cluster(3);
  auto warm = cluster.spawn("warm", {2, 2, 2}, {"steps", "2"});
  expect_all_succeed(warm, cluster);  // the nodes' connections exist from here on
  std::vector<DaemonResources> baseline;
  for (int node = 0; node < 3; ++node) {
    // Once the daemon has seen the warm ranks go: no client mapping left.
    const pid_t pid = cluster.daemon(node).process().pid();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (resources_of(pid).memfd_mappings != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    baseline.push_back(resources_of(pid));
  }
  for (int round = 0; round < 5; ++round) {
    const std::string job = "killed-" + std::to_string(round);
    auto ranks = cluster.spawn(job, {2, 2, 2}, {"steps", "200"});
    // Mid-step: once every rank has joined. (A rank that joins after its job failed and was
    // torn down starts it anew, and only the formation timeout ends its wait.)
    for (int node = 0; node < 3; ++node) {
      ASSERT_TRUE(wait_for_local_ranks(cluster.daemon(node).socket_path(), job, 2,
                                       std::chrono::seconds(20)))
          << job << ": node " << node << "'s ranks did not all join";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 70 * round));
    ranks[3].signal(SIGKILL);  // node 1's second rank
    const auto killed_at = std::chrono::steady_clock::now();
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (r == 3) continue;
      const auto status = ranks[r].wait_for(std::chrono::seconds(20));
      ASSERT_TRUE(status) << job << ": rank " << r << " hung after rank 3 was killed";
      EXPECT_EQ(*status, 100 + GRADSYNC_ERR_PEER_FAILED) << job << ": rank " << r;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(20));
    ranks[3].wait();
  }
  auto after = cluster.spawn("after-kills", {2, 2, 2}, {"steps", "10"});
  expect_all_succeed(after, cluster);
  // Nothing of the killed jobs stays behind: no buffer held by a receive that never came.
  for (int node = 0; node < 3; ++node) {
    const pid_t pid = cluster.daemon(node).process().pid();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!(resources_of(pid) == baseline[static_cast<size_t>(node)]) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(resources_of(pid).open_fds, baseline[static_cast<size_t>(node)].open_fds)
        << "node " << node;
    EXPECT_EQ(resources_of(pid).memfd_mappings, baseline[static_cast<size_t>(node)].memfd_mappings)
        << "node " << node;
  }
}

// A job that is a part of another (gradsync_job_settings.parent_job) across nodes: a rank the
// whole job loses on one node fails the part on another node, where the lost rank never
// joined it, within a bound.
TEST(Cluster, ARankLostOnOneNodeFailsThePartsHoldingItOnAnother) {
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("whole", {2, 1}, {"parts_rank_lost_across_nodes"});
  expect_all_succeed(ranks, cluster);
}

// A job's node and across-nodes groups made parts of it (gradsync_job_settings_for_group): a
// rank the job loses before it joined them fails the groups holding it, on both nodes, within a
// bound; the others run on.
TEST(Cluster, ARankLostFailsTheGroupsOfItsJobThatHoldIt) {
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("whole", {2, 2}, {"groups_rank_lost"});
  expect_all_succeed(ranks, cluster);
}

// A node daemon restarted (SIGTERM, then started again on the same address) while its job's
// ranks are connected: every rank of the job gets an error within a bound, a new job forms
// across the same nodes (the survivor reconnects to the restarted daemon, which binds its
// port again at once), and the survivor's fds and shared-memory mappings are as before.
TEST(Cluster, ADaemonRestartedUnderItsRanksFailsTheJobAndANewOneForms) {
  LoopbackCluster cluster(2);
  auto warm = cluster.spawn("warm", {1, 1}, {"grouped"});
  expect_all_succeed(warm, cluster);  // the nodes' connections exist from here on
  const pid_t survivor = cluster.daemon(0).process().pid();
  const DaemonResources baseline = settled_resources_of(survivor, cluster.daemon(0).socket_path());
  auto ranks = cluster.spawn("restarted", {1, 1}, {"loop", std::to_string(1 << 20)});
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  const auto restarted_at = std::chrono::steady_clock::now();
  cluster.restart(1);
  for (size_t r = 0; r < 2; ++r) {
    const auto status = ranks[r].wait_for(std::chrono::seconds(10));
    ASSERT_TRUE(status) << "rank " << r << " hung across the restart";
    EXPECT_EQ(*status, r == 1 ? GRADSYNC_ERR_DAEMON_GONE : GRADSYNC_ERR_PEER_FAILED)
        << "rank " << r;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - restarted_at, std::chrono::seconds(15));
  // It said goodbye as it stopped: the survivor knows it shut down (an info line), and warns of
  // no broken connection.
  EXPECT_THAT(cluster.log(0), ::testing::Not(::testing::HasSubstr("node daemon " +
                                                                  cluster.address(1) + " failed")));
  auto after = cluster.spawn("after-restart", {1, 1}, {"cluster"});
  expect_all_succeed(after, cluster);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(resources_of(survivor) == baseline) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(resources_of(survivor).open_fds, baseline.open_fds);
  EXPECT_EQ(resources_of(survivor).memfd_mappings, baseline.memfd_mappings);
}

// Node 1's rank withholds a tensor node 0's rank has submitted: node 0 (which knows who has
// reported what) names node 1, and fails the job after stall_shutdown_seconds.
TEST(Cluster, AStallAcrossNodesNamesTheMissingNode) {
  LoopbackCluster cluster(2, "stall_warning_seconds = 1\nstall_shutdown_seconds = 2");
  auto ranks = cluster.spawn("stall", {1, 1}, {"withhold", "node(s) 1 (" + cluster.address(1)});
  const auto status = ranks[0].wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status) << "node 0's rank was never released";
  EXPECT_EQ(*status, 0) << "node 0's rank did not get the stall naming node 1";
  ranks[1].signal(SIGKILL);
}

// Across nodes a rank's question names the node whose ranks have not submitted the tensor.
TEST(Cluster, ARankAsksWhatItsJobWaitsForAcrossNodes) {
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("asked", {1, 1}, {"waiting_for", "node(s) 1 (" + cluster.address(1)});
  const auto status = ranks[0].wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status) << "node 0's rank never finished asking";
  EXPECT_EQ(*status, 0) << "node 0's rank was not told its job waits for node 1";
  ranks[1].signal(SIGKILL);
}

// Every node keeps every node's reports of a new name: node 1, too, names node 2 as the one
// whose rank has not submitted it (in its log, and in its rank's error).
TEST(Cluster, EveryNodeNamesTheNodeAStallWaitsFor) {
  LoopbackCluster cluster(3, "stall_warning_seconds = 1\nstall_shutdown_seconds = 3");
  const std::string missing = "node(s) 2 (" + cluster.address(2);
  auto ranks = cluster.spawn("stall", {1, 1, 1}, {"withhold", missing, "2"});
  for (const int submitter : {0, 1}) {
    const auto status = ranks[static_cast<size_t>(submitter)].wait_for(std::chrono::seconds(30));
    ASSERT_TRUE(status) << "rank " << submitter << " was never released";
    EXPECT_EQ(*status, 0) << "rank " << submitter << " did not get the stall naming node 2";
  }
  const std::string log = cluster.log(1);
  const size_t warning = log.find("tensor 'withheld.tensor' is ready on node 1 and has waited");
  ASSERT_NE(warning, std::string::npos) << log;
  EXPECT_NE(log.substr(warning, log.find('\n', warning) - warning).find(missing), std::string::npos)
      << log;
  ranks[2].signal(SIGKILL);
}

// One rank on each of `nodes` (daemons of the cluster), as a job of its own over them.
std::vector<tools::ChildProcess> spawn_over(LoopbackCluster& cluster, const std::string& job,
                                            const std::vector<int>& nodes,
                                            const std::vector<std::string>& args) {
  std::string addresses;
  for (const int node : nodes) addresses += (addresses.empty() ? "" : ",") + cluster.address(node);
  std::vector<tools::ChildProcess> ranks;
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<std::string> argv = {tools::executable_dir() + "/gradsync-test-rank"};
    argv.insert(argv.end(), args.begin(), args.end());
    ranks.emplace_back(argv, std::map<std::string, std::string>{
                                 {"GRADSYNC_SOCKET", cluster.daemon(nodes[i]).socket_path()},
                                 {"GRADSYNC_JOB", job},
                                 {"GRADSYNC_NODES", addresses},
                                 {"GRADSYNC_NODE_RANK", std::to_string(i)},
                                 {"RANK", std::to_string(i)},
                                 {"WORLD_SIZE", std::to_string(nodes.size())},
                                 {"LOCAL_RANK", "0"},
                                 {"LOCAL_WORLD_SIZE", "1"}});
  }
  return ranks;
}

// Elastic re-formation, as torchrun's elastic launch does it: a node is lost mid-training (its
// daemon and its rank killed), every other rank's call fails within the bound, and the job
// re-forms at once under the same name on the nodes left, with a smaller world; once the node
// is back, the job re-forms on all three. Nothing of the earlier memberships stays behind on
// the nodes that lived through it.
TEST(Cluster, AJobReformsUnderItsNameOnTheNodesLeftAndAgainWhenTheLostNodeReturns) {
  LoopbackCluster cluster(3, "", /*metrics=*/true);
  auto warm = spawn_over(cluster, "warm", {0, 1, 2}, {"grouped"});
  expect_all_succeed(warm, cluster);  // the nodes' connections exist from here on
  std::vector<DaemonResources> baseline;
  for (int node : {0, 1}) {
    baseline.push_back(settled_resources_of(cluster.daemon(node).process().pid(),
                                            cluster.daemon(node).socket_path()));
  }
  auto ranks = spawn_over(cluster, "elastic", {0, 1, 2}, {"loop", std::to_string(1 << 20)});
  ASSERT_NO_FATAL_FAILURE(kill_daemon_and_expect_every_rank_fails(cluster, ranks, 2));

  auto smaller = spawn_over(cluster, "elastic", {0, 1}, {"cluster"});
  expect_all_succeed(smaller, cluster);

  cluster.restart(2);
  auto whole = spawn_over(cluster, "elastic", {0, 1, 2}, {"cluster"});
  expect_all_succeed(whole, cluster);

  for (int node : {0, 1}) {
    const DaemonResources now = settled_resources_of(cluster.daemon(node).process().pid(),
                                                     cluster.daemon(node).socket_path());
    EXPECT_EQ(now.open_fds, baseline[static_cast<size_t>(node)].open_fds) << "node " << node;
    EXPECT_EQ(now.memfd_mappings, baseline[static_cast<size_t>(node)].memfd_mappings)
        << "node " << node;
  }
  // Nor do the job's metric series: they went with each membership.
  EXPECT_THAT(scrape(cluster.metrics_port()),
              ::testing::Not(::testing::HasSubstr("training_job=\"elastic\"")));
}

// A peer daemon SIGKILLed while large tensors run fused in place (halving-doubling: receives
// posted straight into many ranks' buffers at once, a message per tensor): every surviving rank
// fails within the bound, the survivors serve the next job right, and none of the failed job's
// buffers stays mapped on them, though UCX may still have held receives into them.
TEST(Cluster, APeerKilledDuringInPlaceFusionFailsTheJobAndLeavesNoBufferMapped) {
  LoopbackCluster cluster(4, "", true);
  auto warm = cluster.spawn("warm", {1, 1, 1, 1}, {"steps", "2"});
  expect_all_succeed(warm, cluster);  // the nodes' connections exist from here on
  const std::vector<int> survivors = {0, 2, 3};
  std::vector<DaemonResources> baseline;
  baseline.reserve(survivors.size());
  for (const int node : survivors) {
    baseline.push_back(settled_resources_of(cluster.daemon(node).process().pid(),
                                            cluster.daemon(node).socket_path()));
  }
  auto ranks = cluster.spawn("fused-victim", {1, 1, 1, 1}, {"fused_sizes", "1000"},
                             {{"GRADSYNC_ALGO", "rhd"}});
  for (int node = 0; node < 4; ++node) {
    ASSERT_TRUE(wait_for_local_ranks(cluster.daemon(node).socket_path(), "fused-victim", 1,
                                     std::chrono::seconds(20)))
        << "node " << node << "'s rank did not join";
  }
  // Once node 0 has run in-place batches: packed ones, of the small tensors, hold far less.
  bool fused_in_place = false;
  const auto fused_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fused_in_place && std::chrono::steady_clock::now() < fused_by) {
    fused_in_place =
        sample(scrape(cluster.metrics_port()), "gradsync_fusion_batch_bytes_sum") > 4e6;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
#ifndef GRADSYNC_SANITIZED
  // Instrumented, each tensor may arrive alone (see expect_job_fuses).
  EXPECT_TRUE(fused_in_place) << "no in-place batch on node 0 before the kill";
#endif
  cluster.daemon(1).process().signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  for (const int node : survivors) {
    const auto status = ranks[static_cast<size_t>(node)].wait_for(std::chrono::seconds(10));
    ASSERT_TRUE(status) << "node " << node << "'s rank hung after node 1's daemon died";
    EXPECT_EQ(*status, 100 + GRADSYNC_ERR_PEER_FAILED) << "node " << node << "'s rank";
  }
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(10));
  const auto victim = ranks[1].wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(victim) << "node 1's rank hung after its daemon died";
  EXPECT_NE(*victim, 0);
  auto after = spawn_over(cluster, "after-fused-kill", survivors, {"fused_sizes"});
  expect_all_succeed(after, cluster);
  for (size_t i = 0; i < survivors.size(); ++i) {
    const pid_t pid = cluster.daemon(survivors[i]).process().pid();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (resources_of(pid).memfd_mappings != baseline[i].memfd_mappings &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const DaemonResources now = resources_of(pid);
    EXPECT_EQ(now.memfd_mappings, baseline[i].memfd_mappings) << "node " << survivors[i];
    // The connection to the dead node is gone; nothing else may be left open.
    EXPECT_LE(now.open_fds, baseline[i].open_fds) << "node " << survivors[i];
  }
}

// Node 0 is in the middle of a large allreduce with node 1 when node 1's daemon stops dead
// (SIGSTOP: its connection stays up, it just says nothing). Node 0 must go on serving another
// job, with node 2, long before the stalled one could time out.
TEST(Cluster, AStalledPeerDoesNotHoldUpOtherJobs) {
  LoopbackCluster cluster(3, "peer_timeout_seconds = 120", true);
  auto stalled = spawn_over(cluster, "stalled", {0, 1}, {"loop", std::to_string(256 << 20)});
  const auto started_by = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (sample(scrape(cluster.metrics_port()),
                "gradsync_internode_allreduces_total{algorithm=\"ring\"}") < 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), started_by) << "the large allreduce never began";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  cluster.daemon(1).process().signal(SIGSTOP);
  auto other = spawn_over(cluster, "other", {0, 2}, {"grouped"});
  for (size_t r = 0; r < other.size(); ++r) {
    const auto status = other[r].wait_for(std::chrono::seconds(30));
    EXPECT_TRUE(status) << "rank " << r << " of the other job waited on the stalled one";
    EXPECT_EQ(status.value_or(-1), 0) << "rank " << r;
  }
  cluster.daemon(1).process().signal(SIGCONT);
}

// Node 2's daemon stops dead after it joined a job and before the job formed: node 0, forming
// it, measures its link from node 2 and hears nothing. It must go on serving another job, with
// node 1, meanwhile; and once node 2 goes on, the job forms and runs.
TEST(Cluster, APeerStalledWhileAJobMeasuresItsLinksDoesNotHoldUpOtherJobs) {
  using std::chrono::seconds;
  LoopbackCluster cluster(3, "peer_timeout_seconds = 120");
  // The nodes' connections exist from here on: a join crosses at once.
  auto warm = cluster.spawn("warm", {1, 1, 1}, {"grouped"});
  expect_all_succeed(warm, cluster);
  const std::vector<int> shape = {1, 1, 1};
  std::vector<tools::ChildProcess> measured;
  for (const int node : {2, 1}) {
    auto rank = cluster.spawn("measured", shape, {"grouped"}, {}, node);
    measured.push_back(std::move(rank.front()));
    ASSERT_TRUE(
        wait_for_local_ranks(cluster.daemon(node).socket_path(), "measured", 1, seconds(30)));
  }
  // Their joins reach node 0 (in milliseconds; the margin is for sanitizer builds).
  std::this_thread::sleep_for(seconds(2));
  cluster.daemon(2).process().signal(SIGSTOP);
  auto first = cluster.spawn("measured", shape, {"grouped"}, {}, 0);
  measured.push_back(std::move(first.front()));
  const bool measuring =
      wait_for_job_state(cluster.daemon(0).socket_path(), "measured", "measuring", seconds(30));
  EXPECT_TRUE(measuring) << "node 0 never began measuring the job's links";
  auto other = spawn_over(cluster, "other", {0, 1}, {"grouped"});
  for (size_t r = 0; r < other.size(); ++r) {
    const auto status = other[r].wait_for(seconds(30));
    EXPECT_TRUE(status) << "rank " << r << " of the other job waited on the stalled node";
    EXPECT_EQ(status.value_or(-1), 0) << "rank " << r;
  }
  cluster.daemon(2).process().signal(SIGCONT);
  expect_all_succeed(measured, cluster);
}

}  // namespace
}  // namespace gradsync::testing
