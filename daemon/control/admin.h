// Answers to gradsyncctl, rendered as JSON on the control thread: the daemon's status (from an
// engine snapshot) and job traces in the Chrome trace-event format (chrome://tracing, Perfetto).
#pragma once

#include "daemon/base/config.h"
#include "daemon/engine/inspect.h"
#include "ipc/system.h"

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace gradsync::daemon {

// What the control thread knows of the daemon itself.
struct DaemonInfo {
  std::string version;
  pid_t pid = 0;
  std::chrono::steady_clock::time_point started;
  std::string listen_address;   // inter-node, as peers name it; empty: none
  std::string metrics_address;  // HOST:PORT bound for /metrics (port 0 resolved); empty: none
  std::string reduce_isa;
  std::string devices;  // Devices::summary(): the GPUs served, or why none
};

std::string status_json(const DaemonInfo& daemon, const DaemonConfig& config,
                        const EngineSnapshot& snapshot);
// What `viewer` may see of a snapshot: all of it for root and the daemon's own uid (the
// operator); for anyone else their own clients and the jobs `owner_of` names them owner of,
// with the number of jobs left out in `hidden_jobs`. Peers are the node's, not a job's: kept.
void restrict_to_viewer(EngineSnapshot& snapshot, uid_t viewer, uid_t daemon_uid,
                        const std::function<std::optional<uid_t>(const std::string&)>& owner_of);
// The configuration as a JSON object, key for key as in the TOML file.
std::string config_json(const DaemonConfig& config);
std::string trace_json(const TraceData& trace, uint32_t node_rank);

// A sealed memfd holding `text`, to hand to the asker (reports outgrow control frames).
ipc::UniqueFd report_memfd(std::string_view text);

}  // namespace gradsync::daemon
