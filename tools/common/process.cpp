#include "tools/common/process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <utility>

extern char** environ;

namespace gradsync::tools {

ChildProcess::ChildProcess(const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env) {
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) merged[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [key, value] : env) merged[key] = value;
  std::vector<std::string> env_strings;
  env_strings.reserve(merged.size());
  for (const auto& [key, value] : merged) env_strings.push_back(key + "=" + value);
  std::vector<char*> env_ptrs;
  env_ptrs.reserve(env_strings.size() + 1);
  for (auto& s : env_strings) env_ptrs.push_back(s.data());
  env_ptrs.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> arg_ptrs;
  arg_ptrs.reserve(args.size() + 1);
  for (auto& s : args) arg_ptrs.push_back(s.data());
  arg_ptrs.push_back(nullptr);
  // The child starts with no blocked signals, whatever its parent blocks.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  const int rc =
      posix_spawn(&pid_, args[0].c_str(), nullptr, &attributes, arg_ptrs.data(), env_ptrs.data());
  posix_spawnattr_destroy(&attributes);
  if (rc != 0) throw std::runtime_error("spawn " + args[0] + ": " + std::strerror(rc));
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    this->~ChildProcess();
    pid_ = std::exchange(other.pid_, -1);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

void ChildProcess::signal(int signo) const {
  if (pid_ > 0) ::kill(pid_, signo);
}

std::optional<int> ChildProcess::wait_for(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pid_ > 0) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return 255;
    }
    if (r < 0 && errno != EINTR) {
      pid_ = -1;
      return 255;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return 255;
}

int ChildProcess::wait() {
  return *wait_for(std::chrono::hours(24 * 365));
}

std::string executable_dir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

PrivateDaemon::PrivateDaemon(const std::string& gradsyncd_path,
                             const std::vector<std::string>& extra_args,
                             const std::vector<std::string>& launcher,
                             const std::map<std::string, std::string>& env) {
  std::string pattern = (std::filesystem::temp_directory_path() / "gradsync-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  }
  directory_ = pattern;
  ::chmod(directory_.c_str(), 0755);  // tests connect from other uids too
  socket_path_ = directory_ + "/gradsyncd.sock";
  std::vector<std::string> argv = launcher;
  argv.insert(argv.end(), {gradsyncd_path, "--socket", socket_path_});
  // Quiet unless the caller asks for more.
  if (std::find(extra_args.begin(), extra_args.end(), "--log-level") == extra_args.end()) {
    argv.insert(argv.end(), {"--log-level", "warn"});
  }
  // No metrics endpoint unless the caller asks for one.
  if (std::find(extra_args.begin(), extra_args.end(), "--metrics-listen") == extra_args.end()) {
    argv.insert(argv.end(), {"--metrics-listen", ""});
  }
  // Its own inter-node port, unless the caller names one: private daemons never collide.
  if (std::find(extra_args.begin(), extra_args.end(), "--listen") == extra_args.end()) {
    argv.insert(argv.end(), {"--listen", "127.0.0.1:0"});
  }
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  process_ = ChildProcess(argv, env);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!std::filesystem::exists(socket_path_)) {
    if (auto status = process_.wait_for(std::chrono::milliseconds(5))) {
      throw std::runtime_error("gradsyncd exited with status " + std::to_string(*status) +
                               " before listening");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("gradsyncd did not create its socket within 20 s");
    }
  }
}

int PrivateDaemon::stop(std::chrono::milliseconds timeout) {
  if (exit_status_) return *exit_status_;
  process_.signal(SIGTERM);
  exit_status_ = process_.wait_for(timeout);
  if (!exit_status_) {
    process_.signal(SIGKILL);
    process_.wait();
    exit_status_ = 255;
  }
  return *exit_status_;
}

PrivateDaemon::~PrivateDaemon() {
  stop();
  std::error_code ignored;
  std::filesystem::remove_all(directory_, ignored);
}

}  // namespace gradsync::tools
