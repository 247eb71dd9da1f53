// gradsync-bench: allreduce/broadcast/allgather/reduce-scatter/all-to-all performance, nccl-tests
// style.
#include "tools/bench/cluster.h"
#include "tools/bench/options.h"
#include "tools/bench/runner.h"
#include "tools/common/process.h"

#include <gradsync/gradsync.hpp>

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string_view>

namespace {

using gradsync::bench::BenchOptions;

// -np K: K local ranks of a fresh job, optionally on a private daemon.
int launch(const BenchOptions& o) {
  std::unique_ptr<gradsync::tools::PrivateDaemon> daemon;
  std::map<std::string, std::string> env;
  if (o.spawn_daemon) {
    const std::string path =
        o.daemon_path.empty() ? gradsync::tools::executable_dir() + "/gradsyncd" : o.daemon_path;
    std::vector<std::string> args;
    if (!o.daemon_config.empty()) args = {"--config", o.daemon_config};
    daemon = std::make_unique<gradsync::tools::PrivateDaemon>(path, args);
    env["GRADSYNC_SOCKET"] = daemon->socket_path();
  }
  const int ranks = o.processes > 0 ? o.processes : 1;
  env["GRADSYNC_JOB"] = "gradsync-bench-" + std::to_string(::getpid());
  env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = std::to_string(ranks);
  std::vector<gradsync::tools::ChildProcess> children;
  std::vector<std::string> argv = o.rank_argv;
  argv[0] = gradsync::tools::executable_dir() + "/gradsync-bench";
  for (int r = 0; r < ranks; ++r) {
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    children.emplace_back(argv, env);
  }
  int worst = 0;
  for (auto& child : children) worst = std::max(worst, child.wait());
  if (daemon && daemon->stop() != 0 && worst == 0) {
    std::fprintf(stderr, "gradsync-bench: gradsyncd did not stop cleanly\n");
    worst = 1;
  }
  return worst;
}

int run_rank(const BenchOptions& o) {
  gradsync::Communicator comm;
  gradsync_options who{};
  gradsync_options_from_env(&who);
  if (!o.calibrate_path.empty()) {
    gradsync::bench::run_calibration(o, comm, who);
    return 0;
  }
  const uint64_t wrong = o.model.empty()
                             ? gradsync::bench::run_sweep(o, comm, who)
                             : gradsync::bench::run_model(o, comm, who.rank, who.world_size);
  return wrong == 0 ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Asked anywhere on the line, as the other tools' CLI11 parsers answer them.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(gradsync::bench::usage().c_str(), stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("gradsync-bench %s\n", GRADSYNC_VERSION);
      return 0;
    }
  }
  BenchOptions options;
  try {
    options = gradsync::bench::parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsync-bench: %s\n%s", e.what(), gradsync::bench::usage().c_str());
    return 64;
  }
  try {
    if (options.cluster_nodes > 0) return gradsync::bench::launch_cluster(options);
    if (options.processes > 0 || options.spawn_daemon) return launch(options);
    return run_rank(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsync-bench: %s\n", e.what());
    return 1;
  }
}
