// gradsync-bench --cluster N: the whole multi-node benchmark on one machine. Sets up N network
// namespaces (scripts/netns-cluster), starts one gradsyncd per namespace with UCX on TCP over
// the namespace's veth, runs -np ranks per node, and tears it all down, whatever happens.
#include "tools/bench/cluster.h"

#include "tools/common/process.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>

namespace gradsync::bench {
namespace {

// Installed beside gradsync-bench as gradsync-netns-cluster, or in the source tree.
std::string netns_script() {
  std::string installed = tools::executable_dir() + "/gradsync-netns-cluster";
  if (std::filesystem::exists(installed)) return installed;
  std::string source = std::string(GRADSYNC_SOURCE_DIR) + "/scripts/netns-cluster";
  if (std::filesystem::exists(source)) return source;
  throw std::runtime_error("cannot find gradsync-netns-cluster beside gradsync-bench");
}

// Set by SIGINT/SIGTERM: the run stops its ranks and still tears everything down. (A signal
// handler can only reach a flag like this one.)
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int signo) {
  g_stop_signal.store(signo);
}

// Catches SIGINT and SIGTERM for as long as it lives; a child's exec resets them to default.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &old_int_);
    ::sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

std::string node_address(int node) {
  return "198.18.0." + std::to_string(node + 1) + ":9478";
}

// The core every process of namespace node `node` runs on: the (node mod n)-th of the n cores
// this process may use. A real node has cores of its own; left to the scheduler, the nodes here
// mix on this machine's cores, and two nodes' daemons sharing one for seconds at a time makes
// a small collective's step time jump (bench/launch.py pins bench/compare's nodes alike).
int node_cpu(int node) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) == 0) return 0;
  int wanted = node % CPU_COUNT(&allowed);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed) && wanted-- == 0) return cpu;
  }
  return 0;
}

// The namespaces, for as long as this lives.
class Namespaces {
 public:
  Namespaces(std::string script, std::string prefix, int nodes, const std::string& rate)
      : script_(std::move(script)), prefix_(std::move(prefix)), nodes_(nodes) {
    std::vector<std::string> argv = {script_, "up", std::to_string(nodes)};
    if (!rate.empty()) argv.insert(argv.end(), {"--rate", rate});
    if (tools::ChildProcess(argv, env()).wait() != 0) {
      throw std::runtime_error("could not set up the namespace cluster");
    }
  }
  ~Namespaces() { tools::ChildProcess({script_, "down", std::to_string(nodes_)}, env()).wait(); }
  Namespaces(const Namespaces&) = delete;
  Namespaces& operator=(const Namespaces&) = delete;

  std::map<std::string, std::string> env() const { return {{"GRADSYNC_NETNS_PREFIX", prefix_}}; }
  // Runs in node `node`'s namespace, on its core (node_cpu).
  std::vector<std::string> exec(int node) const {
    // util-linux's, always there on Debian (processes are spawned without a PATH search).
    return {"/usr/bin/taskset",  "-c", std::to_string(node_cpu(node)), script_, "exec",
            std::to_string(node)};
  }

 private:
  std::string script_;
  std::string prefix_;
  int nodes_;
};

}  // namespace

// 32 random bytes in a file only this user can read, removed on destruction.
class ClusterKeyFile {
 public:
  ClusterKeyFile() {
    std::string pattern = (std::filesystem::temp_directory_path() / "gradsync-key-XXXXXX").string();
    const int fd = ::mkstemp(pattern.data());  // mode 0600
    if (fd < 0) throw std::runtime_error("mkstemp: " + std::string(std::strerror(errno)));
    path_ = pattern;
    std::array<uint8_t, 32> key{};
    std::random_device random;
    for (auto& byte : key) byte = static_cast<uint8_t>(random());
    const bool written = ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size());
    ::close(fd);
    if (!written) throw std::runtime_error("cannot write the cluster key to " + path_);
  }
  ~ClusterKeyFile() { std::filesystem::remove(path_); }
  ClusterKeyFile(const ClusterKeyFile&) = delete;
  ClusterKeyFile& operator=(const ClusterKeyFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int launch_cluster(const BenchOptions& o) {
  if (::geteuid() != 0) throw std::runtime_error("--cluster needs root (network namespaces)");
  const int nodes = o.cluster_nodes;
  const int per_node = o.processes > 0 ? o.processes : 1;
  const StopSignals signals;
  Namespaces namespaces(netns_script(), "gsbench" + std::to_string(::getpid()), nodes,
                        o.cluster_rate);
  const std::string gradsyncd =
      o.daemon_path.empty() ? tools::executable_dir() + "/gradsyncd" : o.daemon_path;
  // The nodes authenticate each other, as in production (a fresh key, gone with the run).
  const ClusterKeyFile key;
  std::vector<std::unique_ptr<tools::PrivateDaemon>> daemons;
  std::string addresses;
  for (int n = 0; n < nodes; ++n) {
    addresses += (n == 0 ? "" : ",") + node_address(n);
    // Nodes share no memory: UCX on TCP, over the node's own link.
    std::vector<std::string> launcher = namespaces.exec(n);
    launcher.insert(launcher.end(), {"env", "UCX_TLS=tcp", "UCX_NET_DEVICES=eth0"});
    std::vector<std::string> args{"--listen", node_address(n), "--cluster-key-file", key.path()};
    if (!o.daemon_config.empty()) args.insert(args.end(), {"--config", o.daemon_config});
    daemons.push_back(
        std::make_unique<tools::PrivateDaemon>(gradsyncd, args, launcher, namespaces.env()));
  }
  std::vector<tools::ChildProcess> ranks;
  std::vector<std::string> bench_argv = o.rank_argv;
  bench_argv[0] = tools::executable_dir() + "/gradsync-bench";
  for (int n = 0; n < nodes; ++n) {
    for (int local = 0; local < per_node; ++local) {
      std::map<std::string, std::string> env = namespaces.env();
      env["GRADSYNC_SOCKET"] = daemons[static_cast<size_t>(n)]->socket_path();
      env["GRADSYNC_JOB"] = "gradsync-bench-" + std::to_string(::getpid());
      env["GRADSYNC_NODES"] = addresses;
      env["GRADSYNC_NODE_RANK"] = std::to_string(n);
      env["RANK"] = std::to_string(n * per_node + local);
      env["WORLD_SIZE"] = std::to_string(nodes * per_node);
      env["LOCAL_RANK"] = std::to_string(local);
      env["LOCAL_WORLD_SIZE"] = std::to_string(per_node);
      std::vector<std::string> argv = namespaces.exec(n);
      argv.insert(argv.end(), bench_argv.begin(), bench_argv.end());
      ranks.emplace_back(argv, env);
    }
  }
  int worst = 0;
  for (auto& rank : ranks) {
    std::optional<int> status;
    while (!(status = rank.wait_for(std::chrono::milliseconds(100)))) {
      if (const int signo = g_stop_signal.exchange(0); signo != 0) {
        std::fprintf(stderr, "gradsync-bench: signal %d: stopping the ranks, tearing down\n",
                     signo);
        for (auto& other : ranks) other.signal(SIGTERM);
        worst = std::max(worst, 128 + signo);
      }
    }
    worst = std::max(worst, *status);
  }
  for (auto& daemon : daemons) {
    if (daemon->stop() != 0 && worst == 0) {
      std::fprintf(stderr, "gradsync-bench: a node's gradsyncd did not stop cleanly\n");
      worst = 1;
    }
  }
  return worst;
}

}  // namespace gradsync::bench
