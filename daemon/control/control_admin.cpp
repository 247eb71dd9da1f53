// The control thread's operator side: gradsyncctl's questions, and SIGHUP.
#include "daemon/control/control.h"

#include "daemon/base/log.h"
#include "ipc/protocol.h"
#include "transport/reachable_address.h"

#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

namespace gradsync::daemon {
namespace {

// How long gradsyncctl status waits for the engine: a stuck engine gets an answer saying so.
constexpr auto kSnapshotTimeout = std::chrono::seconds(2);
// While traces are recording, how often the control thread looks for finished ones.
constexpr int kTracePollMs = 20;
// Bounds on what one trace may ask for.
constexpr uint32_t kMaxTraceSteps = 10'000;
constexpr uint32_t kMaxTraceEvents = 1'000'000;
constexpr uint32_t kMaxTraceSeconds = 3600;

// The keys whose values differ between two configurations as to_toml writes them (one
// `key = value` line each), in the order it lists them.
std::vector<std::string> changed_keys(const std::string& before_toml,
                                      const std::string& after_toml) {
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    size_t begin = 0;
    while (begin < text.size()) {
      const size_t end = std::min(text.find('\n', begin), text.size());
      out.push_back(text.substr(begin, end - begin));
      begin = end + 1;
    }
    return out;
  };
  const std::vector<std::string> before = lines(before_toml);
  std::vector<std::string> changed;
  for (const std::string& line : lines(after_toml)) {
    if (std::find(before.begin(), before.end(), line) == before.end()) {
      changed.push_back(line.substr(0, line.find(" =")));
    }
  }
  return changed;
}

}  // namespace

void ControlServer::handle_inspect(Client& client, ipc::wire::Inspect::Reader inspect) {
  switch (inspect.which()) {
    case ipc::wire::Inspect::STATUS: {
      std::optional<EngineSnapshot> view = engine_snapshot(client);
      if (!view) return;
      // A job's names, ranks and progress are its owner's business (and the operator's).
      restrict_to_viewer(*view, client.credentials.uid, ::geteuid(),
                         [this](const std::string& job) -> std::optional<uid_t> {
                           const auto it = jobs_.find(job);
                           if (it == jobs_.end()) return std::nullopt;
                           return it->second.owner;
                         });
      reply_report(client, status_json(info_, config_, *view));
      return;
    }
    case ipc::wire::Inspect::TRACE:
      start_trace(client, inspect.getTrace());
      return;
    case ipc::wire::Inspect::NODE_ADDRESS:
      reply_node_address(client);
      return;
    case ipc::wire::Inspect::WAITING_FOR:
      reply_waiting_for(client, inspect.getWaitingFor().cStr());
      return;
  }
  reply_error(client, GRADSYNC_ERR_PROTOCOL, "unknown inspect request");
}

std::optional<EngineSnapshot> ControlServer::engine_snapshot(Client& client) {
  InspectEngine command;
  auto snapshot = command.snapshot.get_future();
  engine_.post(std::move(command));
  if (snapshot.wait_for(kSnapshotTimeout) != std::future_status::ready) {
    reply_error(
        client, GRADSYNC_ERR_TIMEOUT,
        fmt::format("the engine thread has not answered in {} s", kSnapshotTimeout.count()));
    return std::nullopt;
  }
  try {
    return snapshot.get();
  } catch (const std::future_error&) {  // the engine went without answering (shutdown)
    reply_error(client, GRADSYNC_ERR_DAEMON_GONE, "gradsyncd is shutting down");
    return std::nullopt;
  }
}

void ControlServer::reply_waiting_for(Client& client, const std::string& job) {
  // Another user's job is as unknown to the asker as one that is not there (as in status).
  const uid_t viewer = client.credentials.uid;
  const auto record = jobs_.find(job);
  if (record == jobs_.end() ||
      (viewer != 0 && viewer != ::geteuid() && record->second.owner != viewer)) {
    reply_error(client, GRADSYNC_ERR_INVALID_ARGUMENT,
                fmt::format("no job '{}' of yours on this daemon", job));
    return;
  }
  const std::optional<EngineSnapshot> view = engine_snapshot(client);
  if (!view) return;
  std::string waiting;
  for (const JobView& candidate : view->jobs) {
    if (candidate.name == job) waiting = candidate.stall;
  }
  capnp::MallocMessageBuilder reply;
  reply.initRoot<ipc::wire::Reply>().setWaitingFor(waiting);
  ipc::send_frame(client.socket.get(), ipc::encode(reply));
}

void ControlServer::reply_node_address(Client& client) {
  if (info_.listen_address.empty()) {
    reply_error(client, GRADSYNC_ERR_UNSUPPORTED,
                "this gradsyncd has no inter-node listener (listen is empty): it serves jobs of "
                "one node only");
    return;
  }
  std::string address;
  try {
    address = transport::reachable_address(info_.listen_address);
  } catch (const std::exception& e) {
    reply_error(client, GRADSYNC_ERR_UNSUPPORTED, e.what());
    return;
  }
  capnp::MallocMessageBuilder reply;
  reply.initRoot<ipc::wire::Reply>().setNodeAddress(address);
  ipc::send_frame(client.socket.get(), ipc::encode(reply));
}

void ControlServer::start_trace(Client& client, ipc::wire::TraceRequest::Reader request) {
  StartTrace command;
  command.job = request.getJob().cStr();
  command.steps = request.getSteps();
  command.max_events = request.getMaxEvents();
  const uint32_t seconds = request.getTimeoutSeconds();
  if (command.steps < 1 || command.steps > kMaxTraceSteps || command.max_events < 1 ||
      command.max_events > kMaxTraceEvents || seconds < 1 || seconds > kMaxTraceSeconds) {
    reply_error(client, GRADSYNC_ERR_INVALID_ARGUMENT,
                fmt::format("a trace records 1-{} steps, 1-{} events, for 1-{} s", kMaxTraceSteps,
                            kMaxTraceEvents, kMaxTraceSeconds));
    return;
  }
  command.timeout = std::chrono::seconds(seconds);
  const auto job = jobs_.find(command.job);
  if (job == jobs_.end()) {
    reply_error(client, GRADSYNC_ERR_INVALID_ARGUMENT,
                fmt::format("no job '{}' on this node", command.job));
    return;
  }
  // A job's tensor names and timings are its owner's business (and the operator's).
  const uid_t uid = client.credentials.uid;
  if (uid != 0 && uid != ::geteuid() && uid != job->second.owner) {
    metrics_.client_rejected("permission");
    reply_error(client, GRADSYNC_ERR_PERMISSION,
                fmt::format("job '{}' belongs to uid {}; uid {} may not trace it", command.job,
                            job->second.owner, uid));
    return;
  }
  traces_.push_back(PendingTrace{client.id, job->second.node_rank, command.result.get_future()});
  engine_.post(std::move(command));
}

int ControlServer::poll_timeout_ms() const {
  const int watchdog = watchdog_.poll_timeout_ms();
  if (traces_.empty()) return watchdog;
  return watchdog < 0 ? kTracePollMs : std::min(watchdog, kTracePollMs);
}

void ControlServer::deliver_traces() {
  for (auto it = traces_.begin(); it != traces_.end();) {
    if (it->result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      ++it;
      continue;
    }
    TraceData trace;
    try {
      trace = it->result.get();
    } catch (const std::future_error&) {  // the engine went without answering (shutdown)
      trace.error = "gradsyncd is shutting down";
    }
    const auto client = clients_.find(it->client);
    if (client != clients_.end()) {
      if (!trace.error.empty()) {
        reply_error(*client->second, GRADSYNC_ERR_INVALID_ARGUMENT, trace.error);
      } else {
        log_->info("job '{}': trace of {} events delivered ({})", trace.job, trace.events.size(),
                   trace.ended);
        try {
          reply_report(*client->second, trace_json(trace, it->node_rank));
        } catch (const std::exception& e) {
          log_->warn("client {}: trace not delivered: {}", it->client, e.what());
        }
      }
    }
    it = traces_.erase(it);
  }
}

void ControlServer::reply_report(Client& client, std::string_view text) {
  const ipc::UniqueFd report = report_memfd(text);
  capnp::MallocMessageBuilder reply;
  reply.initRoot<ipc::wire::Reply>().initReport().setBytes(text.size());
  const std::array<int, 1> fds = {report.get()};
  ipc::send_frame(client.socket.get(), ipc::encode(reply), fds);
}

void ControlServer::reload() {
  sd_notify(0, "RELOADING=1\nSTATUS=reloading the configuration");
  DaemonConfig fresh;
  try {
    fresh = reload_();
    validate(fresh);
  } catch (const std::exception& e) {
    log_->error("SIGHUP: the configuration was not reloaded: {}", e.what());
    sd_notify(0, "READY=1\nSTATUS=serving (the last reload failed)");
    return;
  }
  // What binds sockets or sizes threads stays until a restart: say so, keep the old value.
  for (const std::string& key : keep_restart_only_keys(fresh, config_)) {
    log_->warn("SIGHUP: {} changed; it takes effect when gradsyncd restarts", key);
  }
  const std::string after = to_toml(fresh);
  const std::vector<std::string> changed = changed_keys(to_toml(config_), after);
  if (changed.empty()) {
    log_->info("SIGHUP: the configuration is unchanged");
  } else {
    config_ = fresh;
    set_log_level(config_.log_level);
    engine_.post(Reconfigure{config_});
    metrics_.set_config_info(after);
    // Jobs formed across nodes keep what node 0 told them then (fusion threshold, cache
    // capacity, algorithm): every node must run with the same.
    log_->info("SIGHUP: reloaded {}; running jobs across nodes keep the settings they formed with",
               fmt::join(changed, ", "));
  }
  sd_notify(0, "READY=1\nSTATUS=serving");
}

}  // namespace gradsync::daemon
