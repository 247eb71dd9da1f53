// Several gradsyncd on one machine, one per "node", talking UCX over TCP on loopback: the
// multi-node path without root. Each test that uses one gets fresh daemons.
#pragma once

#include "tests/integration/harness.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradsync::testing {

class LoopbackCluster {
 public:
  // `toml`: configuration for every node's daemon. `metrics`: node 0 serves its metrics on
  // metrics_port(). `node_keys`: each node's cluster key ("" for none); by default, one key
  // shared by all, so every cluster test runs the cluster handshake. `daemon_args`: more
  // flags for every daemon. Each daemon's log (its stderr) is kept for log().
  explicit LoopbackCluster(int nodes, const std::string& toml = "", bool metrics = false,
                           std::vector<std::string> node_keys = {},
                           const std::vector<std::string>& daemon_args = {}) {
    static int clusters = 0;
    directory_ =
        std::filesystem::temp_directory_path() /
        ("gradsync-cluster-" + std::to_string(::getpid()) + "-" + std::to_string(clusters++));
    std::filesystem::create_directories(directory_);
    config_path_ = directory_ / "gradsyncd.toml";
    std::ofstream(config_path_) << toml << "\n";
    if (node_keys.empty()) node_keys.assign(static_cast<size_t>(nodes), "the loopback cluster key");
    node_keys_ = node_keys;
    for (int n = 0; n < nodes; ++n) {
      // Port 0: each daemon binds a free port itself, so no other test can take it between a
      // probe and the bind. The bound address is the node's from then on, restarts included.
      std::vector<std::string> args{"--listen", "127.0.0.1:0", "--config", config_path_};
      args.insert(args.end(), daemon_args.begin(), daemon_args.end());
      if (const std::string& key = node_keys[static_cast<size_t>(n)]; !key.empty()) {
        key_files_.push_back(directory_ / ("node" + std::to_string(n) + ".key"));
        write_key(key_files_.back(), key);
        args.insert(args.end(), {"--cluster-key-file", key_files_.back()});
      } else {
        key_files_.emplace_back();
      }
      if (metrics && n == 0) args.insert(args.end(), {"--metrics-listen", "127.0.0.1:0"});
      daemon_args_.push_back(args);
      daemons_.push_back(start(n, "node" + std::to_string(n)));
      const BoundAddresses bound = bound_addresses(daemons_.back()->socket_path());
      set_flag(daemon_args_.back(), "--listen", bound.listen);
      addresses_ += (n == 0 ? "" : ",") + bound.listen;
      node_addresses_.push_back(bound.listen);
      if (metrics && n == 0) {
        metrics_port_ = port_of(bound.metrics);
        set_flag(daemon_args_.back(), "--metrics-listen", bound.metrics);
      }
    }
  }
  // Starts `count` daemons with `--role aggregator` (docs/aggregators.md), each with node 0's
  // key (or `key`, "" for none) and `args`; returns their HOST:PORT list, as a job's
  // GRADSYNC_AGGREGATORS names them. Their logs are aggregator_log(i).
  std::string start_aggregators(int count, const std::optional<std::string>& key = std::nullopt,
                                const std::vector<std::string>& args = {}) {
    std::string addresses;
    for (int a = 0; a < count; ++a) {
      const int index = static_cast<int>(aggregators_.size());
      std::vector<std::string> daemon_args{"--role",      "aggregator", "--listen",
                                           "127.0.0.1:0", "--config",   config_path_};
      daemon_args.insert(daemon_args.end(), args.begin(), args.end());
      const std::filesystem::path key_file =
          directory_ / ("aggregator" + std::to_string(index) + ".key");
      if (const std::string text = key.value_or(node_keys_.front()); !text.empty()) {
        write_key(key_file, text);
        daemon_args.insert(daemon_args.end(), {"--cluster-key-file", key_file});
      }
      aggregators_.push_back(std::make_unique<tools::PrivateDaemon>(
          tools::executable_dir() + "/gradsyncd", daemon_args,
          logged_to(directory_ / ("aggregator" + std::to_string(index) + ".log"))));
      addresses += (a == 0 ? "" : ",") + bound_addresses(aggregators_.back()->socket_path()).listen;
    }
    return addresses;
  }
  tools::PrivateDaemon& aggregator(int index) { return *aggregators_[static_cast<size_t>(index)]; }
  std::string aggregator_log(int index) const {
    return read_file(directory_ / ("aggregator" + std::to_string(index) + ".log"));
  }

  // Stops node n's daemon (SIGTERM, as systemd restarts a service) and starts it again with
  // the same address, configuration and key; its socket path changes.
  void restart(int node) {
    daemons_[static_cast<size_t>(node)]->stop();
    daemons_[static_cast<size_t>(node)] = start(node, "node" + std::to_string(node));
  }
  ~LoopbackCluster() {
    daemons_.clear();
    aggregators_.clear();
    std::filesystem::remove_all(directory_);
  }
  LoopbackCluster(const LoopbackCluster&) = delete;
  LoopbackCluster& operator=(const LoopbackCluster&) = delete;
  int nodes() const { return static_cast<int>(daemons_.size()); }
  uint16_t metrics_port() const { return metrics_port_; }
  const std::string& addresses() const { return addresses_; }
  const std::string& address(int node) const { return node_addresses_[static_cast<size_t>(node)]; }
  tools::PrivateDaemon& daemon(int node) { return *daemons_[static_cast<size_t>(node)]; }
  // Node n's key file (empty path: it has none), and what its daemon has logged so far.
  const std::filesystem::path& key_file(int node) const {
    return key_files_[static_cast<size_t>(node)];
  }
  std::string log(int node) const {
    return read_file(directory_ / ("node" + std::to_string(node) + ".log"));
  }

  // ranks_per_node[n] ranks on node n, global ranks in node order.
  std::vector<tools::ChildProcess> spawn(const std::string& job,
                                         const std::vector<int>& ranks_per_node,
                                         const std::vector<std::string>& args,
                                         const std::map<std::string, std::string>& extra_env = {},
                                         std::optional<int> only_node = std::nullopt) {
    const int world = std::accumulate(ranks_per_node.begin(), ranks_per_node.end(), 0);
    std::vector<tools::ChildProcess> children;
    int rank = 0;
    for (int node = 0; node < nodes(); ++node) {
      for (int local = 0; local < ranks_per_node[static_cast<size_t>(node)]; ++local, ++rank) {
        std::vector<std::string> argv = {tools::executable_dir() + "/gradsync-test-rank"};
        argv.insert(argv.end(), args.begin(), args.end());
        std::map<std::string, std::string> env{
            {"GRADSYNC_SOCKET", daemon(node).socket_path()},
            {"GRADSYNC_JOB", job},
            {"GRADSYNC_NODES", addresses_},
            {"GRADSYNC_NODE_RANK", std::to_string(node)},
            {"RANK", std::to_string(rank)},
            {"WORLD_SIZE", std::to_string(world)},
            {"LOCAL_RANK", std::to_string(local)},
            {"LOCAL_WORLD_SIZE", std::to_string(ranks_per_node[static_cast<size_t>(node)])}};
        for (const auto& [key, value] : extra_env) env[key] = value;
        if (!only_node || *only_node == node) children.emplace_back(argv, env);
      }
    }
    return children;
  }

 private:
  // The value after `flag` in `args` becomes `value`.
  static void set_flag(std::vector<std::string>& args, const std::string& flag,
                       const std::string& value) {
    const auto it = std::find(args.begin(), args.end(), flag);
    if (it == args.end() || it + 1 == args.end()) throw std::logic_error("no " + flag);
    *(it + 1) = value;
  }

  std::unique_ptr<tools::PrivateDaemon> start(int node, const std::string& name) const {
    return std::make_unique<tools::PrivateDaemon>(tools::executable_dir() + "/gradsyncd",
                                                  daemon_args_[static_cast<size_t>(node)],
                                                  logged_to(directory_ / (name + ".log")));
  }
  // The wrapper that appends a daemon's stderr to `log`.
  static std::vector<std::string> logged_to(const std::filesystem::path& log) {
    return {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>" + log.string()};
  }
  static void write_key(const std::filesystem::path& path, const std::string& key) {
    std::ofstream(path) << key << "\n";
    std::filesystem::permissions(
        path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  static std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::vector<std::vector<std::string>> daemon_args_;
  uint16_t metrics_port_ = 0;
  std::filesystem::path directory_;
  std::filesystem::path config_path_;
  std::vector<std::filesystem::path> key_files_;
  std::string addresses_;
  std::vector<std::string> node_addresses_;
  std::vector<std::string> node_keys_;
  std::vector<std::unique_ptr<tools::PrivateDaemon>> daemons_;
  std::vector<std::unique_ptr<tools::PrivateDaemon>> aggregators_;
};

}  // namespace gradsync::testing
