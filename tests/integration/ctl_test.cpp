// gradsyncctl against a live daemon with real ranks: tables, JSON, traces, exit codes; and
// SIGHUP reloading the configuration.
#include "tests/integration/harness.h"
#include "tests/integration/loopback_cluster.h"

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace gradsync::testing {
namespace {

using Json = nlohmann::json;

class CtlTest : public DaemonTest {
 protected:
  CommandResult ctl(const std::string& args) const {
    return run_command(build_dir() + "/gradsyncctl --socket " + socket() + " " + args +
                       " 2>/dev/null");
  }
  Json ctl_json(const std::string& args) const {
    const CommandResult result = ctl("--json " + args);
    EXPECT_EQ(result.status, 0) << args;
    return Json::parse(result.out);
  }
  // Polls `gradsyncctl --json status` until `ready` holds for it.
  template <typename Ready>
  Json status_when(Ready ready) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    Json status;
    do {
      status = ctl_json("status");
      if (ready(status)) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < deadline);
    ADD_FAILURE() << "never came about: " << status.dump(2);
    return status;
  }
  std::string temp_file(const std::string& name) const {
    return std::filesystem::temp_directory_path() /
           ("gradsync-ctl-" + std::to_string(::getpid()) + "-" + name);
  }
};

// Lines of a table that mention `text`.
int lines_with(const std::string& table, const std::string& text) {
  int lines = 0;
  size_t begin = 0;
  while (begin < table.size()) {
    const size_t end = std::min(table.find('\n', begin), table.size());
    if (table.substr(begin, end - begin).find(text) != std::string::npos) ++lines;
    begin = end + 1;
  }
  return lines;
}

TEST_F(CtlTest, ShowsClientsJobsAndConfigurationAsTablesAndJson) {
  start_daemon("stall_warning_seconds = 42");
  auto ranks = spawn_ranks("ctl-job", 2, {"loop", "4096"});
  const Json status = status_when([](const Json& s) {
    return s["clients"].size() == 2 && s["clients"][0]["completed"].get<uint64_t>() > 10 &&
           s["clients"][1]["completed"].get<uint64_t>() > 10;
  });
  EXPECT_FALSE(status["version"].get<std::string>().empty());
  EXPECT_EQ(status["pid"].get<pid_t>(), daemon().process().pid());
  EXPECT_EQ(status["socket"], socket());
  EXPECT_EQ(status["config"]["stall_warning_seconds"], 42);
  // The devices served, or why none: on a machine without a GPU, host memory only.
  const std::string devices = status["devices"].get<std::string>();
  EXPECT_TRUE(devices.find("host memory only") != std::string::npos ||
              devices.rfind("CUDA, ", 0) == 0)
      << devices;
  ASSERT_EQ(status["jobs"].size(), 1u);
  const Json& job = status["jobs"][0];
  EXPECT_EQ(job["name"], "ctl-job");
  EXPECT_EQ(job["state"], "running");
  EXPECT_EQ(job["local_ranks"], 2);
  EXPECT_EQ(job["world_size"], 2);
  std::set<pid_t> pids;
  for (const Json& client : status["clients"]) {
    EXPECT_EQ(client["job"], "ctl-job");
    EXPECT_EQ(client["uid"].get<uid_t>(), ::getuid());
    EXPECT_EQ(client["buffers"], 1);
    EXPECT_LE(client["completed"].get<uint64_t>(), client["submitted"].get<uint64_t>());
    pids.insert(client["pid"].get<pid_t>());
  }
  EXPECT_EQ(pids, (std::set<pid_t>{ranks[0].pid(), ranks[1].pid()}));

  // The tables say the same.
  const CommandResult jobs = ctl("jobs");
  ASSERT_EQ(jobs.status, 0);
  EXPECT_EQ(jobs.out.rfind("JOB", 0), 0u) << jobs.out;
  EXPECT_EQ(lines_with(jobs.out, "ctl-job"), 1) << jobs.out;
  EXPECT_NE(jobs.out.find("running"), std::string::npos) << jobs.out;
  EXPECT_NE(jobs.out.find("2/2"), std::string::npos) << jobs.out;
  const CommandResult clients = ctl("clients");
  ASSERT_EQ(clients.status, 0);
  for (const auto& rank : ranks) {
    EXPECT_EQ(lines_with(clients.out, " " + std::to_string(rank.pid()) + " "), 1) << clients.out;
  }
  const CommandResult config = ctl("config");
  ASSERT_EQ(config.status, 0);
  EXPECT_EQ(lines_with(config.out, "stall_warning_seconds"), 1);
  EXPECT_NE(config.out.find("42"), std::string::npos) << config.out;
  const CommandResult overview = ctl("status");
  ASSERT_EQ(overview.status, 0);
  EXPECT_NE(overview.out.find("2 clients, 1 jobs, 0 peers"), std::string::npos) << overview.out;
  EXPECT_NE(overview.out.find("devices: " + devices), std::string::npos) << overview.out;
  // --json after the command as well as before it; each view is the status's part.
  const CommandResult peers = ctl("peers --json");
  ASSERT_EQ(peers.status, 0);
  EXPECT_EQ(Json::parse(peers.out), Json::array());
}

// A job that is a part of another shows which, and a job the ranks it lost; the part holding
// one of them shows that it failed, and why.
TEST_F(CtlTest, ShowsWhichJobAPartBelongsToAndTheRanksAJobLost) {
  start_daemon();
  RawClient first(socket());
  RawClient second(socket());
  RawClient part(socket());
  ASSERT_EQ(first.hello("whole", 0, 2).first, 0u);
  ASSERT_EQ(second.hello("whole", 1, 2).first, 0u);
  ASSERT_EQ(part.hello("whole.pair", 0, 2, ipc::kProtocolVersion, "whole", {0, 1}).first, 0u);
  const Json before = status_when([](const Json& s) { return s["jobs"].size() == 2; });
  for (const Json& job : before["jobs"]) {
    if (job["name"] == "whole.pair") {
      EXPECT_EQ(job["parent"], (Json{{"job", "whole"}, {"ranks", {0, 1}}}));
    } else {
      EXPECT_TRUE(job["parent"].is_null());
      EXPECT_EQ(job["lost_ranks"], Json::array());
    }
  }
  ::shutdown(second.socket(), SHUT_RDWR);  // rank 1's connection ends without a goodbye
  const Json after = status_when([](const Json& s) {
    for (const Json& job : s["jobs"]) {
      if (job["name"] == "whole.pair") return job["state"] == "failed";
    }
    return false;
  });
  ASSERT_EQ(after["jobs"].size(), 2u);
  for (const Json& job : after["jobs"]) {
    if (job["name"] == "whole") {
      EXPECT_EQ(job["lost_ranks"], Json({1}));
    } else {
      EXPECT_NE(job["failure"].get<std::string>().find("rank 1 of job 'whole'"), std::string::npos)
          << job["failure"];
    }
  }
  const CommandResult jobs = ctl("jobs");
  ASSERT_EQ(jobs.status, 0);
  EXPECT_NE(jobs.out.find("part of whole"), std::string::npos) << jobs.out;
  EXPECT_NE(jobs.out.find("lost ranks [1]"), std::string::npos) << jobs.out;
}

TEST_F(CtlTest, TraceRecordsTheAskedStepsAsAChromeTrace) {
  start_daemon();
  auto ranks = spawn_ranks("traced", 2, {"steps", "100000", "8", "1000"});
  status_when([](const Json& s) { return s["clients"].size() == 2; });
  const std::string file = temp_file("trace.json");
  const CommandResult result = ctl("trace --job traced --steps 4 -o " + file);
  ASSERT_EQ(result.status, 0);
  std::ifstream in(file);
  const Json trace = Json::parse(in);
  std::filesystem::remove(file);
  EXPECT_EQ(trace["otherData"]["steps"], 4);
  EXPECT_EQ(trace["otherData"]["tensors"], 8);
  std::map<std::string, int> phases;
  std::map<int, std::string> rows;
  for (const Json& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name") {
      rows[event["tid"].get<int>()] = event["args"]["name"];
    }
    if (event["ph"] != "X") continue;
    ++phases[event["name"].get<std::string>()];
    EXPECT_GE(event["ts"].get<double>(), 0);
    EXPECT_GE(event["dur"].get<double>(), 0);
    EXPECT_GT(event["args"]["bytes"].get<uint64_t>(), 0u);
  }
  // Every tensor has its row. The ranks shuffle their tensors each step, so the 4 periods of
  // the first tensor recorded hold 3 whole steps and parts of two more: each tensor of those
  // went through every phase.
  EXPECT_EQ(rows.size(), 8u);
  for (const char* phase : {"negotiate", "queue", "local reduce"}) {
    EXPECT_GE(phases[phase], 3 * 8) << phase;
    EXPECT_LE(phases[phase], 6 * 8) << phase;
  }
  // Tracing ended with the recording: the job carries on untraced, and may be traced again at
  // once.
  const Json status = ctl_json("status");
  EXPECT_FALSE(status["jobs"][0]["traced"].get<bool>());
  EXPECT_EQ(ctl("trace --job traced --steps 1 -o " + file).status, 0);
  std::filesystem::remove(file);
}

TEST_F(CtlTest, ExitCodesSayWhatWentWrong) {
  start_daemon();
  EXPECT_EQ(ctl("status").status, 0);
  // 1: the daemon refused (no such job).
  EXPECT_EQ(ctl("trace --job nobody --steps 1 -o " + temp_file("none.json")).status, 1);
  std::filesystem::remove(temp_file("none.json"));
  // 2: usage.
  EXPECT_EQ(ctl("").status, 2);
  EXPECT_EQ(ctl("frobnicate").status, 2);
  EXPECT_EQ(ctl("trace --steps 1").status, 2);  // no --job, no -o
  // 3: no daemon there.
  EXPECT_EQ(run_command(build_dir() + "/gradsyncctl --socket " + temp_file("absent.sock") +
                        " status 2>/dev/null")
                .status,
            3);
}

TEST_F(CtlTest, AnotherUserCannotTraceOrSeeAJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  start_daemon();
  auto ranks = spawn_ranks("private", 2, {"loop", "4096"});
  status_when([](const Json& s) { return s["clients"].size() == 2; });
  const CommandResult result = run_command("setpriv --reuid 65534 --regid 65534 --clear-groups " +
                                           build_dir() + "/gradsyncctl --socket " + socket() +
                                           " trace --job private --steps 1 -o " + "/dev/null 2>&1");
  EXPECT_EQ(result.status, 1) << result.out;
  EXPECT_NE(result.out.find("may not trace"), std::string::npos) << result.out;
  // The daemon's status is open to whoever may use the socket; the job's name, ranks and
  // progress are not: another uid sees that a job exists, not which.
  const CommandResult status =
      run_command("setpriv --reuid 65534 --regid 65534 --clear-groups " + build_dir() +
                  "/gradsyncctl --socket " + socket() + " --json status 2>&1");
  ASSERT_EQ(status.status, 0) << status.out;
  const Json seen = Json::parse(status.out);
  EXPECT_TRUE(seen["jobs"].empty()) << status.out;
  EXPECT_TRUE(seen["clients"].empty()) << status.out;
  EXPECT_EQ(seen["hidden_jobs"], 1);
  EXPECT_EQ(status.out.find("private"), std::string::npos) << status.out;
  const CommandResult table =
      run_command("setpriv --reuid 65534 --regid 65534 --clear-groups " + build_dir() +
                  "/gradsyncctl --socket " + socket() + " status 2>&1");
  EXPECT_NE(table.out.find("(1 jobs of other users not shown)"), std::string::npos) << table.out;
  // The owner (here root, also the operator) sees it all.
  EXPECT_EQ(ctl_json("status")["jobs"].size(), 1u);
}

TEST_F(CtlTest, SighupReloadsLiveKeysAndKeepsTheOthersUntilRestart) {
  start_logged_daemon("stall_warning_seconds = 60\nreduce_threads = 1");
  EXPECT_EQ(ctl_json("config")["stall_warning_seconds"], 60);
  // A live key, and one that needs a restart.
  rewrite_config("stall_warning_seconds = 1\nreduce_threads = 2");
  daemon().process().signal(SIGHUP);
  status_when([](const Json& s) { return s["config"]["stall_warning_seconds"] == 1; });
  EXPECT_EQ(ctl_json("config")["reduce_threads"], 1);
  EXPECT_NE(daemon_log().find("reduce_threads changed; it takes effect when gradsyncd restarts"),
            std::string::npos)
      << daemon_log();
  // The engine runs with the new value: a tensor withheld for a second is warned about.
  auto ranks = spawn_ranks("reloaded", 2, {"withhold"});
  const auto warned = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (daemon_log().find("tensor 'withheld.tensor' has waited") == std::string::npos &&
         std::chrono::steady_clock::now() < warned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(daemon_log().find("tensor 'withheld.tensor' has waited"), std::string::npos)
      << daemon_log();
  ranks.clear();
  // A broken file changes nothing and says why; the daemon serves on.
  rewrite_config("stall_warning_seconds = \"soon\"");
  daemon().process().signal(SIGHUP);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (daemon_log().find("was not reloaded") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(daemon_log().find("was not reloaded"), std::string::npos) << daemon_log();
  EXPECT_NE(daemon_log().find("stall_warning_seconds"), std::string::npos);
  EXPECT_EQ(ctl_json("config")["stall_warning_seconds"], 1);
}

// Across two nodes: the peer's traffic and measured link, and the network phases in a trace.
TEST(CtlCluster, ShowsPeersAndTracesTheNetworkPhases) {
  LoopbackCluster cluster(2);
  auto ranks = cluster.spawn("wide", {1, 1}, {"steps", "100000", "8", "200000"});
  const std::string ctl =
      tools::executable_dir() + "/gradsyncctl --socket " + cluster.daemon(0).socket_path();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Json peers;
  do {
    const CommandResult result = run_command(ctl + " --json peers");
    ASSERT_EQ(result.status, 0);
    peers = Json::parse(result.out);
    // The link probe's own traffic may pass 1 MiB before its figures are out: wait for both.
    if (peers.size() == 1 && peers[0]["bytes_received"].get<uint64_t>() > (1u << 20) &&
        peers[0]["latency_seconds"].get<double>() > 0) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(peers.size(), 1u) << peers.dump(2);
  const Json& peer = peers[0];
  EXPECT_EQ(peer["address"], cluster.address(1));
  EXPECT_EQ(peer["state"], "connected");
  EXPECT_GT(peer["bytes_sent"].get<uint64_t>(), 1u << 20);
  EXPECT_GT(peer["bytes_received"].get<uint64_t>(), 1u << 20);
  EXPECT_EQ(peer["errors"], 0);
  EXPECT_GT(peer["latency_seconds"].get<double>(), 0);
  EXPECT_GT(peer["bytes_per_second"].get<double>(), 0);
  const CommandResult table = run_command(ctl + " peers");
  EXPECT_NE(table.out.find(cluster.address(1)), std::string::npos) << table.out;

  const std::string file = std::filesystem::temp_directory_path() /
                           ("gradsync-ctl-" + std::to_string(::getpid()) + "-wide.json");
  ASSERT_EQ(run_command(ctl + " trace --job wide --steps 3 -o " + file + " 2>/dev/null").status, 0);
  std::ifstream in(file);
  const Json trace = Json::parse(in);
  std::filesystem::remove(file);
  std::map<std::string, int> phases;
  for (const Json& event : trace["traceEvents"]) {
    if (event["ph"] == "X") ++phases[event["name"].get<std::string>()];
  }
  // The large tensors cross the network; the local reduce and the delivery to the ranks show
  // within it. (The smallest may piggyback on the negotiation and skip the network.)
  EXPECT_GE(phases["negotiate"], 2 * 8);  // 2 whole steps at least (see above)
  EXPECT_GT(phases["network"], 0);
  EXPECT_GT(phases["local reduce"], 0);
  EXPECT_GT(phases["broadcast"], 0);
  EXPECT_EQ(trace["otherData"]["node_rank"], 0);
}

}  // namespace
}  // namespace gradsync::testing
