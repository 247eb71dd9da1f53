// gradsyncctl: asks a running gradsyncd what it is doing, over its control socket.
//   gradsyncctl [--socket PATH] [--json] status|jobs|clients|peers|config
//   gradsyncctl trace --job J [--steps N] [--max-events N] [--timeout S] -o FILE.json
#include "tools/ctl/daemon_connection.h"
#include "tools/ctl/render.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>

#ifndef GRADSYNC_VERSION
#define GRADSYNC_VERSION "0.0.0"
#endif

namespace {

using namespace gradsync;
using namespace gradsync::ctl;

// The daemon answers status at once, or says its engine is stuck within 2 s.
constexpr std::chrono::seconds kStatusTimeout{10};
// A trace ends at its own time limit; this is the slack for rendering and delivery.
constexpr std::chrono::seconds kTraceSlack{30};

struct Options {
  std::string socket;
  bool json = false;
  std::string view;  // status, jobs, clients, peers, config
  std::string job;
  uint32_t steps = 5;
  uint32_t max_events = 200'000;
  uint32_t timeout_seconds = 60;
  std::string output;
};

nlohmann::json status_of(const Options& options) {
  DaemonConnection daemon(options.socket);
  capnp::MallocMessageBuilder request;
  request.initRoot<ipc::wire::Request>().initInspect().setStatus();
  const std::string text = daemon.ask(request, kStatusTimeout);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CtlError(kExitUnreachable, std::string("gradsyncd's status is not JSON: ") + e.what());
  }
}

int show(const Options& options) {
  const nlohmann::json status = status_of(options);
  if (options.json) {
    // The part asked for: scripts get the same shapes the tables show.
    const nlohmann::json& part = options.view == "status" ? status : status[options.view];
    std::cout << part.dump(2) << "\n";
    return kExitOk;
  }
  if (options.view == "status") print_status(status, std::cout);
  if (options.view == "jobs") print_jobs(status, std::cout);
  if (options.view == "clients") print_clients(status, std::cout);
  if (options.view == "peers") print_peers(status, std::cout);
  if (options.view == "config") print_config(status, std::cout);
  return kExitOk;
}

int trace(const Options& options) {
  std::ofstream out(options.output, std::ios::binary | std::ios::trunc);
  if (!out) throw CtlError(kExitUsage, "cannot write " + options.output);
  DaemonConnection daemon(options.socket);
  capnp::MallocMessageBuilder request;
  auto ask = request.initRoot<ipc::wire::Request>().initInspect().initTrace();
  ask.setJob(options.job);
  ask.setSteps(options.steps);
  ask.setMaxEvents(options.max_events);
  ask.setTimeoutSeconds(options.timeout_seconds);
  std::cerr << "gradsyncctl: tracing job '" << options.job << "' for " << options.steps
            << " steps (at most " << options.timeout_seconds << " s)...\n";
  const std::string text =
      daemon.ask(request, std::chrono::seconds(options.timeout_seconds) + kTraceSlack);
  out << text;
  out.close();
  if (!out) throw CtlError(kExitUsage, "cannot write " + options.output);
  const auto summary = nlohmann::json::parse(text)["otherData"];
  std::cerr << "gradsyncctl: " << summary["events"] << " events of " << summary["tensors"]
            << " tensors in " << options.output << " (" << summary["ended"].get<std::string>()
            << ")\n";
  return kExitOk;
}

int run(int argc, char** argv) {
  CLI::App app{"gradsyncctl: inspect a running gradsyncd"};
  Options options;
  const char* socket = std::getenv("GRADSYNC_SOCKET");
  options.socket = socket != nullptr && *socket != '\0' ? socket : "/run/gradsync/gradsyncd.sock";
  app.add_option("--socket", options.socket,
                 "gradsyncd's socket (default: $GRADSYNC_SOCKET or "
                 "/run/gradsync/gradsyncd.sock)");
  app.add_flag("--json", options.json, "print JSON instead of tables");
  app.set_version_flag("--version", GRADSYNC_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // `gradsyncctl jobs --json` as well as `gradsyncctl --json jobs`
  for (const char* view : {"status", "jobs", "clients", "peers", "config"}) {
    app.add_subcommand(view, std::string("show ") + view)->callback([&options, view] {
      options.view = view;
    });
  }
  auto* trace_command = app.add_subcommand(
      "trace", "record a job's per-tensor events as a Chrome trace (chrome://tracing, Perfetto)");
  trace_command->add_option("--job", options.job, "the job")->required();
  trace_command->add_option("--steps", options.steps, "steps to record (default 5)")
      ->check(CLI::Range(1, 10'000));
  trace_command->add_option("--max-events", options.max_events, "at most (default 200000)")
      ->check(CLI::Range(1, 1'000'000));
  trace_command->add_option("--timeout", options.timeout_seconds, "seconds at most (default 60)")
      ->check(CLI::Range(1, 3600));
  trace_command->add_option("-o,--output", options.output, "the trace file")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }
  return trace_command->parsed() ? trace(options) : show(options);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const CtlError& e) {
    std::cerr << "gradsyncctl: " << e.what() << "\n";
    return e.code();
  } catch (const std::exception& e) {
    std::cerr << "gradsyncctl: " << e.what() << "\n";
    return kExitUnreachable;
  }
}
