// gradsyncd: the per-node gradient communication daemon.
#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/control/control.h"
#include "daemon/device/devices.h"
#include "daemon/engine/engine.h"
#include "kernels/reduce.h"
#include "metrics/families.h"
#include "metrics/metrics.h"

#include <CLI/CLI.hpp>

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#ifndef GRADSYNC_VERSION
#define GRADSYNC_VERSION "0.0.0"
#endif

namespace {

int run_daemon(const gradsync::daemon::DaemonConfig& config,
               gradsync::daemon::ControlServer::ConfigSource reload) {
  using namespace gradsync;
  auto log = daemon::logger("daemon");
  // Signals are read by the control thread through a signalfd: block them in every thread,
  // which inherit this mask.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &mask, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const daemon::Devices devices = daemon::Devices::probe();
  log->info("devices: {}", devices.summary());
  const size_t mps_devices = static_cast<size_t>(
      std::ranges::count_if(devices.devices(), &daemon::DeviceInfo::shared_via_mps));
  if (mps_devices < devices.devices().size()) {
    log->warn(
        "devices: {} of {} not shared through MPS: the GPU time-slices between this daemon's "
        "and each rank's CUDA context (a switch costs about 0.15 ms), which collectives ordered "
        "on a rank's stream pay; docs/cuda.md says how to run MPS",
        devices.devices().size() - mps_devices, devices.devices().size());
  }
  metrics::Metrics metrics(config.metrics_listen,
                           {GRADSYNC_VERSION, devices.built_with_cuda(), devices.devices().size(),
                            mps_devices, kernels::reduce_isa()},
                           daemon::to_toml(config));
  // Port 0 in metrics_listen picks a free port: name the one bound, as `listen` does.
  std::string metrics_address;
  if (const auto ports = metrics.listening_ports(); !ports.empty()) {
    metrics_address = config.metrics_listen.substr(0, config.metrics_listen.rfind(':')) + ":" +
                      std::to_string(ports.front());
    log->info("metrics on {}", metrics_address);
  }
  daemon::Engine engine(config, metrics, devices);
  daemon::DaemonInfo info{
      GRADSYNC_VERSION,        ::getpid(),      std::chrono::steady_clock::now(),
      engine.listen_address(), metrics_address, kernels::reduce_isa(),
      devices.summary()};
  daemon::ControlServer control(config, engine, metrics, std::move(info), devices,
                                std::move(reload));
  std::thread engine_thread([&engine, &log] {
    pthread_setname_np(pthread_self(), "gsd-engine");  // for top -H, gdb, and the tests
    try {
      engine.run();
    } catch (const std::exception& e) {
      log->critical("engine failed: {}", e.what());
      std::abort();
    }
  });
  try {
    control.run();
  } catch (...) {
    engine.post(daemon::Shutdown{"gradsyncd control thread failed"});
    engine_thread.join();
    throw;
  }
  engine_thread.join();
  log->info("stopped");
  return 0;
}

int parse_and_run(int argc, char** argv) {
  using gradsync::daemon::DaemonConfig;
  CLI::App app{"gradsyncd: gradient communication daemon"};
  std::string config_path;
  std::optional<std::string> socket_path, metrics_listen, listen, cluster_key_file, log_level, role;
  bool print_config = false;
  app.add_option("--config", config_path, "TOML configuration file")->check(CLI::ExistingFile);
  app.add_option("--socket", socket_path, "client socket path (config: socket_path)");
  app.add_option("--metrics-listen", metrics_listen,
                 "HOST:PORT for /metrics, empty to disable (config: metrics_listen)");
  app.add_option("--listen", listen, "HOST:PORT for inter-node traffic (config: listen)");
  app.add_option("--cluster-key-file", cluster_key_file,
                 "file holding the key node daemons prove to each other; mode 0600 (config: "
                 "cluster_key_file)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error (config: log_level)");
  app.add_option("--role", role,
                 "node (serves training processes) or aggregator (sums other nodes' allreduces) "
                 "(config: role)");
  // Given twice (a wrapper's default, then the caller's), the last one holds.
  for (CLI::Option* option : app.get_options()) {
    if (option->get_name() != "--help")
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  app.add_flag("--print-config", print_config, "print the effective configuration and exit");
  std::optional<std::string> print_docs;
  app.add_option("--print-config-docs", print_docs,
                 "print every key's documentation as docs/configuration.md's table (markdown) "
                 "or as systemd/gradsyncd.toml (toml), and exit")
      ->check(CLI::IsMember({"markdown", "toml"}));
  bool print_metrics_docs = false;
  app.add_flag("--print-metrics-docs", print_metrics_docs,
               "print every metric family as docs/metrics.md's table (markdown), and exit");
  app.set_version_flag("--version", GRADSYNC_VERSION);
  CLI11_PARSE(app, argc, argv);
  if (print_metrics_docs) {
    std::cout << gradsync::metrics::families_markdown();
    return 0;
  }
  if (print_docs) {
    using gradsync::daemon::ConfigDocs;
    std::cout << gradsync::daemon::config_docs(*print_docs == "toml" ? ConfigDocs::kToml
                                                                     : ConfigDocs::kMarkdown);
    return 0;
  }

  // The file, then the command line over it: at start and again at each SIGHUP.
  auto read_config = [=] {
    DaemonConfig config = config_path.empty() ? gradsync::daemon::default_config()
                                              : gradsync::daemon::load_config_file(config_path);
    if (socket_path) config.socket_path = *socket_path;
    if (metrics_listen) config.metrics_listen = *metrics_listen;
    if (listen) config.listen = *listen;
    if (cluster_key_file) config.cluster_key_file = *cluster_key_file;
    if (log_level) config.log_level = *log_level;
    if (role) config.role = *role;
    return config;
  };
  try {
    const DaemonConfig config = read_config();
    gradsync::daemon::validate(config);
    if (print_config) {
      std::cout << gradsync::daemon::to_toml(config) << "\n";
      return 0;
    }
    gradsync::daemon::configure_logging(config.log_level, gradsync::daemon::stderr_is_journal());
    return run_daemon(config, read_config);
  } catch (const std::exception& e) {
    std::cerr << "gradsyncd: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return parse_and_run(argc, argv);
  } catch (...) {
    std::cerr << "gradsyncd: unexpected failure\n";
    return 1;
  }
}
