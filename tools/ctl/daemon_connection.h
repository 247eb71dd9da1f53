// gradsyncctl's side of the control socket: one question, one report.
#pragma once

#include "ipc/protocol.capnp.h"
#include "ipc/system.h"

#include <capnp/message.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace gradsync::ctl {

// Exit codes a shell script can rely on (docs/metrics.md, "gradsyncctl").
enum ExitCode : int {
  kExitOk = 0,
  kExitRefused = 1,      // the daemon answered with an error
  kExitUsage = 2,        // bad arguments
  kExitUnreachable = 3,  // no daemon at the socket, or it stopped answering
};

// A failure with the exit code it maps to.
class CtlError : public std::runtime_error {
 public:
  CtlError(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

class DaemonConnection {
 public:
  explicit DaemonConnection(const std::string& socket_path);  // throws CtlError
  // Sends `inspect` and returns the report's text; waits at most `timeout`.
  std::string ask(capnp::MallocMessageBuilder& request, std::chrono::milliseconds timeout);

 private:
  std::string socket_path_;
  ipc::UniqueFd socket_;
};

}  // namespace gradsync::ctl
