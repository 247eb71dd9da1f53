// The control socket of the node's gradsyncd: a connection to it, and the questions a process
// may ask it without joining a job.
#pragma once

#include "ipc/system.h"

#include <string>

namespace gradsync::client {

// A connection to the daemon listening at `path`; throws Error naming the path.
ipc::UniqueFd connect_to_daemon(const std::string& path);

// Where other nodes reach the daemon at `path` (HOST:PORT), asked on a connection of its own;
// throws Error with the daemon's reason where it cannot say (no inter-node listener, or no
// address but loopback).
std::string ask_node_address(const std::string& path, int timeout_ms);

// What the daemon at `path` says job `job` waits for (gradsync_waiting_for), asked on a
// connection of its own; throws Error with the daemon's reason where it cannot say.
std::string ask_waiting_for(const std::string& path, const std::string& job, int timeout_ms);

}  // namespace gradsync::client
