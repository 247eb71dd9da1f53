// Child processes for the tools and tests: ranks, and a private gradsyncd.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::tools {

// A spawned process, killed (SIGKILL) and reaped if still running when destroyed.
class ChildProcess {
 public:
  ChildProcess() = default;
  // argv[0] is the executable's path. `env` entries are added to (or replace) this process's.
  ChildProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  void signal(int signo) const;
  // Exit status (128 + signal for a signalled child), or nullopt on timeout.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  int wait();

 private:
  pid_t pid_ = -1;
};

// The directory of the running executable (to find gradsyncd beside gradsync-bench).
std::string executable_dir();

// A gradsyncd of our own: socket in a fresh private directory, no metrics endpoint unless asked.
// Stopped with SIGTERM (then SIGKILL after a bound) and its directory removed on destruction.
class PrivateDaemon {
 public:
  // `launcher` comes before gradsyncd's own argv (e.g. to start it in a network namespace),
  // with `env` added to its environment.
  explicit PrivateDaemon(const std::string& gradsyncd_path,
                         const std::vector<std::string>& extra_args = {},
                         const std::vector<std::string>& launcher = {},
                         const std::map<std::string, std::string>& env = {});
  ~PrivateDaemon();
  PrivateDaemon(const PrivateDaemon&) = delete;
  PrivateDaemon& operator=(const PrivateDaemon&) = delete;

  const std::string& socket_path() const { return socket_path_; }
  const std::string& directory() const { return directory_; }
  ChildProcess& process() { return process_; }
  // SIGTERM and wait; returns the exit status.
  int stop(std::chrono::milliseconds timeout = std::chrono::seconds(10));

 private:
  std::string directory_;
  std::string socket_path_;
  ChildProcess process_;
  std::optional<int> exit_status_;
};

}  // namespace gradsync::tools
