// The client socket: a unix stream listener that appears in the file system only once it
// accepts connections.
#pragma once

#include "daemon/base/config.h"
#include "ipc/system.h"

namespace gradsync::daemon {

// Listens on config.socket_path with config.socket_mode and socket_group. A stale socket file
// is replaced; a live daemon's is not (throws). Throws SystemError on failure.
ipc::UniqueFd bind_listener(const DaemonConfig& config);

}  // namespace gradsync::daemon
