// The stall inspector against a live daemon: one rank submits a tensor its peer withholds. The
// warning names the tensor and the missing rank, the stall age is a metric, and with
// stall_shutdown_seconds the job fails with that message to the rank that waits.
#include "tests/integration/harness.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace gradsync::testing {
namespace {

class StallTest : public DaemonTest {
 protected:
  void start(const std::string& toml) {
    start_logged_daemon(toml, {"--metrics-listen", "127.0.0.1:0"});
    metrics_port_ = port_of(bound_addresses(socket()).metrics);
  }
  std::string log() const { return daemon_log(); }

  uint16_t metrics_port_ = 0;
};

TEST_F(StallTest, AWithheldTensorIsNamedWithTheRankAndItsAgeExported) {
  start("stall_warning_seconds = 1");
  auto ranks = spawn_ranks("stall", 2, {"withhold"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  double age = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    age = sample(scrape(metrics_port_), "gradsync_stall_seconds{training_job=\"stall\"}");
    if (age >= 2 && log().find("withheld.tensor") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_GE(age, 2) << "the stall age never showed";
  const std::string text = log();
  const size_t warning = text.find("stall: job 'stall': tensor 'withheld.tensor'");
  ASSERT_NE(warning, std::string::npos) << text;
  const std::string line = text.substr(warning, text.find('\n', warning) - warning);
  EXPECT_NE(line.find("local rank(s) 1 (job rank(s) 1)"), std::string::npos) << line;
  // Warned once, not every second.
  EXPECT_EQ(text.find("withheld.tensor", warning + line.size()), std::string::npos) << text;
  // The ranks' sequence numbers say the same: rank 0 submitted one collective, rank 1 none,
  // and nothing completed.
  const std::string metrics = scrape(metrics_port_);
  auto rank_series = [&](const char* what, int rank) {
    return sample(metrics, fmt::format("gradsync_rank_{}_sequence{{local_rank=\"{}\",training_job="
                                       "\"stall\"}}",
                                       what, rank));
  };
  EXPECT_EQ(rank_series("submitted", 0), 1) << metrics;
  EXPECT_EQ(rank_series("submitted", 1), 0);
  EXPECT_EQ(rank_series("completed", 0), 0);
  EXPECT_EQ(rank_series("completed", 1), 0);
  // gradsyncctl's table says what the job waits for, in its row.
  const CommandResult jobs =
      run_command(tools::executable_dir() + "/gradsyncctl --socket " + socket() + " jobs");
  EXPECT_EQ(jobs.status, 0) << jobs.out;
  const size_t row = jobs.out.find("\nstall ");
  ASSERT_NE(row, std::string::npos) << jobs.out;
  const std::string job_row = jobs.out.substr(row + 1, jobs.out.find('\n', row + 1) - row - 1);
  EXPECT_NE(job_row.find("tensor 'withheld.tensor' has waited"), std::string::npos) << jobs.out;
  EXPECT_NE(job_row.find("local rank(s) 1 (job rank(s) 1)"), std::string::npos) << jobs.out;
  for (auto& rank : ranks) rank.signal(SIGKILL);
}

// A rank asks the daemon what its job waits for (gradsync_waiting_for): the tensor and the rank
// that has not submitted it.
TEST_F(StallTest, ARankAsksWhatItsJobWaitsFor) {
  start("");
  auto ranks = spawn_ranks("asked", 2, {"waiting_for", "local rank(s) 1 (job rank(s) 1)"});
  const auto status = ranks[0].wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status) << "rank 0 never finished asking";
  EXPECT_EQ(*status, 0) << "rank 0 was not told what its job waits for";
  ranks[1].signal(SIGKILL);
}

TEST_F(StallTest, StallShutdownFailsTheJobWithTheMessage) {
  start("stall_warning_seconds = 1\nstall_shutdown_seconds = 2");
  auto ranks = spawn_ranks("stall", 2, {"withhold"});
  const auto started = std::chrono::steady_clock::now();
  const auto status = ranks[0].wait_for(std::chrono::seconds(30));
  ASSERT_TRUE(status) << "the waiting rank was never released";
  EXPECT_EQ(*status, 0) << "rank 0 did not get the stall as a timeout naming tensor and rank";
  // The inspector runs once a second: the job fails between 2 and about 3 s in.
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
  ranks[1].signal(SIGKILL);
}

}  // namespace
}  // namespace gradsync::testing
