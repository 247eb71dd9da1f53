// Jobs across loopback nodes whose allreduces go through aggregator daemons
// (docs/aggregators.md): results, the bf16 codec, the split with the ring, and what an
// aggregator's or a worker's death, a keyless peer and a misdirected client get.
#include "tests/integration/harness.h"
#include "tests/integration/loopback_cluster.h"

#include <gmock/gmock.h>

#include <signal.h>

#include <thread>

namespace gradsync::testing {
namespace {

void expect_all_succeed(std::vector<tools::ChildProcess>& ranks, LoopbackCluster& cluster,
                        int aggregators) {
  bool all_succeeded = true;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto status = ranks[r].wait_for(std::chrono::seconds(240));
    EXPECT_EQ(status.value_or(-1), 0) << "rank " << r;
    all_succeeded &= status == 0;
  }
  if (all_succeeded) return;
  for (int n = 0; n < cluster.nodes(); ++n)
    ADD_FAILURE() << "node " << n << ":\n" << cluster.log(n);
  for (int a = 0; a < aggregators; ++a) {
    ADD_FAILURE() << "aggregator " << a << ":\n" << cluster.aggregator_log(a);
  }
}

struct AggregatedJob {
  int nodes;
  int ranks_per_node;
  int aggregators;
  std::string algorithm;  // aggregate or split
};

std::string job_name(const ::testing::TestParamInfo<AggregatedJob>& info) {
  return info.param.algorithm + "_" + std::to_string(info.param.nodes) + "nodes_" +
         std::to_string(info.param.ranks_per_node) + "ranks_" +
         std::to_string(info.param.aggregators) + "aggregators";
}

// Small chunks (4 KiB), so that the scenarios' counts span many chunks, none of them a
// multiple of the chunk or of the aggregator count.
const char* const kSmallChunks = "aggregation_chunk_bytes = 4096";

class AggregatorTest : public ::testing::TestWithParam<AggregatedJob> {};

// Every op, dtype and count (test_rank's `cluster`), then grouped submissions and fused
// tensors of every size, each against its reference; the aggregators ended each job and hold
// none afterwards.
TEST_P(AggregatorTest, EveryCollectiveIsRightThroughTheAggregators) {
  const AggregatedJob& job = GetParam();
  LoopbackCluster cluster(job.nodes, kSmallChunks);
  const std::string aggregators =
      cluster.start_aggregators(job.aggregators, std::nullopt, {"--log-level", "info"});
  const std::map<std::string, std::string> env{{"GRADSYNC_AGGREGATORS", aggregators},
                                               {"GRADSYNC_ALGO", job.algorithm}};
  const std::vector<int> ranks_per_node(static_cast<size_t>(job.nodes), job.ranks_per_node);
  for (const std::vector<std::string>& scenario :
       {std::vector<std::string>{"cluster"}, {"grouped"}, {"fused_sizes", "2"}}) {
    SCOPED_TRACE(scenario[0]);
    auto ranks = cluster.spawn("aggregated-" + scenario[0], ranks_per_node, scenario, env);
    expect_all_succeed(ranks, cluster, job.aggregators);
  }
  for (int a = 0; a < job.aggregators; ++a) {
    EXPECT_EQ(cluster.aggregator(a).stop(), 0);
    const std::string log = cluster.aggregator_log(a);
    EXPECT_THAT(log, ::testing::HasSubstr("job 'aggregated-cluster'")) << "aggregator " << a;
    EXPECT_THAT(log, ::testing::HasSubstr("job 'aggregated-cluster' dropped"))
        << "aggregator " << a;
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("failed here"))) << "aggregator " << a;
  }
}

INSTANTIATE_TEST_SUITE_P(Jobs, AggregatorTest,
                         ::testing::Values(AggregatedJob{2, 1, 1, "aggregate"},
                                           AggregatedJob{3, 2, 3, "aggregate"},
                                           AggregatedJob{3, 1, 2, "split"}),
                         job_name);

// The bf16 wire codec through the aggregators: sums of decoded pushes, encoded once on the
// way back, the same bits on every rank, close to the reference.
TEST(Aggregators, EncodedAllreducesAreCloseAndTheSameOnEveryRank) {
  LoopbackCluster cluster(2, kSmallChunks);
  const std::string aggregators = cluster.start_aggregators(2);
  auto ranks = cluster.spawn("encoded", {1, 1}, {"encoded", std::to_string((1u << 20) + 5)},
                             {{"GRADSYNC_AGGREGATORS", aggregators},
                              {"GRADSYNC_ALGO", "aggregate"},
                              {"GRADSYNC_WIRE_CODEC", "bf16"}});
  expect_all_succeed(ranks, cluster, 2);
}

// An aggregator killed under a job's allreduces: every rank gets an error within 10 s, the
// nodes' logs name the aggregator, and the nodes serve the next job.
TEST(Aggregators, AKilledAggregatorFailsEveryRankWithinTenSeconds) {
  LoopbackCluster cluster(2, "peer_timeout_seconds = 5");
  const std::string aggregators = cluster.start_aggregators(2);
  auto ranks =
      cluster.spawn("victim", {1, 1}, {"loop", std::to_string(1 << 20)},
                    {{"GRADSYNC_AGGREGATORS", aggregators}, {"GRADSYNC_ALGO", "aggregate"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  cluster.aggregator(1).process().signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto status = ranks[r].wait_for(std::chrono::seconds(10));
    ASSERT_TRUE(status) << "rank " << r << " hung after an aggregator died";
    EXPECT_EQ(*status, GRADSYNC_ERR_PEER_FAILED) << "rank " << r;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(10));
  const std::string killed = aggregators.substr(aggregators.find(',') + 1);
  for (int n = 0; n < cluster.nodes(); ++n) {
    EXPECT_THAT(cluster.log(n), ::testing::HasSubstr("aggregator " + killed)) << "node " << n;
  }
  auto after = cluster.spawn("after", {1, 1}, {"grouped"});
  expect_all_succeed(after, cluster, 1);
}

// A worker node's daemon killed under a job: the aggregators drop the job (and its buffers)
// and say so; the surviving node's rank fails within the bound.
TEST(Aggregators, AKilledWorkerEndsTheJobOnTheAggregators) {
  LoopbackCluster cluster(2, "peer_timeout_seconds = 5");
  const std::string aggregators =
      cluster.start_aggregators(1, std::nullopt, {"--log-level", "info"});
  auto ranks =
      cluster.spawn("victim", {1, 1}, {"loop", std::to_string(1 << 20)},
                    {{"GRADSYNC_AGGREGATORS", aggregators}, {"GRADSYNC_ALGO", "aggregate"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  cluster.daemon(1).process().signal(SIGKILL);
  const auto survivor = ranks[0].wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(survivor) << "rank 0 hung after node 1's daemon died";
  EXPECT_EQ(*survivor, GRADSYNC_ERR_PEER_FAILED);
  EXPECT_TRUE(ranks[1].wait_for(std::chrono::seconds(10)));
  // The aggregator notices the lost node itself (its link) or hears of it from node 0.
  for (int waited = 0; waited < 100; ++waited) {
    if (cluster.aggregator_log(0).find("job 'victim' dropped") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(cluster.aggregator_log(0), ::testing::HasSubstr("job 'victim' dropped"));
  const std::string status = run_command(tools::executable_dir() + "/gradsyncctl --socket " +
                                         cluster.aggregator(0).socket_path() + " status --json")
                                 .out;
  EXPECT_THAT(status, ::testing::HasSubstr("\"role\": \"aggregator\""));
  EXPECT_THAT(status, ::testing::HasSubstr("\"aggregated_jobs\": []"));
}

// An aggregator with another cluster key: the job's nodes cannot authenticate it, and every
// rank gets an error rather than a hang.
TEST(Aggregators, AnAggregatorWithoutTheKeyIsRefused) {
  LoopbackCluster cluster(2, "peer_timeout_seconds = 5\njob_formation_timeout_seconds = 5");
  const std::string aggregators = cluster.start_aggregators(1, "another cluster's key");
  auto ranks =
      cluster.spawn("refused", {1, 1}, {"steps", "2", "4", "1000"},
                    {{"GRADSYNC_AGGREGATORS", aggregators}, {"GRADSYNC_ALGO", "aggregate"}});
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto status = ranks[r].wait_for(std::chrono::seconds(30));
    ASSERT_TRUE(status) << "rank " << r << " hung";
    EXPECT_NE(*status, 0) << "rank " << r;
  }
  for (int n = 0; n < cluster.nodes(); ++n) {
    EXPECT_THAT(cluster.log(n), ::testing::HasSubstr("did not prove the cluster key")) << n;
  }
}

// Training processes connected to an aggregator are refused with a clear error, and a job
// that names aggregators without forcing them, or names one twice, is told at once.
TEST(Aggregators, AnAggregatorServesNoRanksAndBadListsAreRefused) {
  LoopbackCluster cluster(2);
  const std::string aggregators = cluster.start_aggregators(1);
  tools::ChildProcess misdirected({tools::executable_dir() + "/gradsync-test-rank", "join"},
                                  {{"GRADSYNC_SOCKET", cluster.aggregator(0).socket_path()},
                                   {"GRADSYNC_JOB", "misdirected"},
                                   {"RANK", "0"},
                                   {"WORLD_SIZE", "1"}});
  EXPECT_EQ(misdirected.wait_for(std::chrono::seconds(10)).value_or(-1),
            GRADSYNC_ERR_INVALID_ARGUMENT);
  for (const auto& [job, env] : std::map<std::string, std::map<std::string, std::string>>{
           {"twice", {{"GRADSYNC_AGGREGATORS", aggregators + "," + aggregators}}},
           {"a-node", {{"GRADSYNC_AGGREGATORS", cluster.address(1)}}},
           {"forced-without", {{"GRADSYNC_ALGO", "aggregate"}}}}) {
    SCOPED_TRACE(job);
    auto ranks = cluster.spawn(job, {1, 1}, {"join"}, env);
    for (auto& rank : ranks) {
      EXPECT_EQ(rank.wait_for(std::chrono::seconds(10)).value_or(-1),
                GRADSYNC_ERR_INVALID_ARGUMENT);
    }
  }
}

}  // namespace
}  // namespace gradsync::testing
