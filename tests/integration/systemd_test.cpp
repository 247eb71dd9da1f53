// gradsyncd as a systemd service: the unit files pass `systemd-analyze verify`, and the daemon
// speaks the notify protocol to a socket this test reads in systemd's place: READY=1 once its
// socket is up, WATCHDOG=1 while its engine thread comes round (and not while that thread is
// stopped, when gradsyncctl hears so too), RELOADING=1 then READY=1 on SIGHUP, STOPPING=1 on
// SIGTERM; and its log lines, when stderr is the journal, carry syslog priorities instead of
// timestamps.
#include "tests/integration/harness.h"

#include <poll.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

namespace gradsync::testing {
namespace {

using std::chrono::milliseconds;

// A datagram socket where the daemon sends its sd_notify messages.
class NotifySocket {
 public:
  NotifySocket()
      : path_(std::filesystem::temp_directory_path() /
              ("gradsync-notify-" + std::to_string(::getpid()))),
        fd_(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) {
    std::filesystem::remove(path_);
    struct sockaddr_un address {};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path_.c_str());
    if (::bind(fd_.get(), reinterpret_cast<struct sockaddr*>(&address), sizeof(address)) != 0) {
      throw std::runtime_error("bind " + path_.string());
    }
  }
  ~NotifySocket() { std::filesystem::remove(path_); }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  std::string path() const { return path_.string(); }

  // The next message, or nothing within `timeout`.
  std::optional<std::string> receive(milliseconds timeout) {
    struct pollfd descriptor {
      fd_.get(), POLLIN, 0
    };
    if (::poll(&descriptor, 1, static_cast<int>(timeout.count())) <= 0) return std::nullopt;
    char buffer[4096];
    const ssize_t n = ::recv(fd_.get(), buffer, sizeof(buffer), 0);
    if (n <= 0) return std::nullopt;
    return std::string(buffer, static_cast<size_t>(n));
  }

  // Messages containing `field` over `window`.
  int count(const std::string& field, milliseconds window) {
    int seen = 0;
    for_each_message(window, [&](const std::string& message) {
      seen += message.find(field) != std::string::npos ? 1 : 0;
      return false;
    });
    return seen;
  }

  // Waits up to `timeout` for a message containing `field`.
  bool wait_for(const std::string& field, milliseconds timeout) {
    return for_each_message(timeout, [&](const std::string& message) {
      return message.find(field) != std::string::npos;
    });
  }

 private:
  // Hands each message of the next `window` to `stop`, until it returns true; whether it did.
  template <typename Stop>
  bool for_each_message(milliseconds window, Stop stop) {
    const auto end = std::chrono::steady_clock::now() + window;
    while (std::chrono::steady_clock::now() < end) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(end - std::chrono::steady_clock::now());
      if (auto message = receive(std::max(left, milliseconds(1))); message && stop(*message)) {
        return true;
      }
    }
    return false;
  }

  std::filesystem::path path_;
  ipc::UniqueFd fd_;
};

// The daemon under a 200 ms watchdog, notifying `notify`.
std::unique_ptr<tools::PrivateDaemon> start_notifying(NotifySocket& notify) {
  return std::make_unique<tools::PrivateDaemon>(
      tools::executable_dir() + "/gradsyncd", std::vector<std::string>{},
      std::vector<std::string>{},
      std::map<std::string, std::string>{{"NOTIFY_SOCKET", notify.path()},
                                         {"WATCHDOG_USEC", "200000"}});
}

// The id of the daemon's engine thread (named gsd-engine).
// Waits a bounded time for it: the daemon may say READY before the engine thread has named
// itself (a failure seen once under load).
pid_t engine_thread(pid_t daemon) {
  const std::string tasks = "/proc/" + std::to_string(daemon) + "/task";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    for (const auto& task : std::filesystem::directory_iterator(tasks)) {
      std::ifstream comm(task.path() / "comm");
      std::string name;
      std::getline(comm, name);
      if (name == "gsd-engine") return static_cast<pid_t>(std::stol(task.path().filename()));
    }
    std::this_thread::sleep_for(milliseconds(10));
  } while (std::chrono::steady_clock::now() < deadline);
  return -1;
}

TEST(Systemd, UnitFileVerifies) {
  // The unit as installed, pointed at the daemon just built.
  const auto directory =
      std::filesystem::temp_directory_path() / ("gradsync-unit-" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  std::ifstream in(std::string(GRADSYNC_SOURCE_DIR) + "/systemd/gradsyncd.service");
  std::stringstream unit;
  unit << in.rdbuf();
  const std::string text = std::regex_replace(unit.str(), std::regex("/usr/local/bin/gradsyncd"),
                                              tools::executable_dir() + "/gradsyncd");
  std::ofstream(directory / "gradsyncd.service") << text;
  const std::string command =
      "systemd-analyze verify " + (directory / "gradsyncd.service").string() + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = ::pclose(pipe);
  std::filesystem::remove_all(directory);
  EXPECT_EQ(status, 0) << output;
  EXPECT_EQ(output, "") << "systemd-analyze found something to say";
}

TEST(Systemd, ReadyThenWatchdogThenStopping) {
  NotifySocket notify;
  auto daemon = start_notifying(notify);
  // PrivateDaemon returns once the socket exists; READY=1 must be there by then or soon.
  ASSERT_TRUE(notify.wait_for("READY=1", milliseconds(5000)));
  EXPECT_TRUE(std::filesystem::exists(daemon->socket_path()));
  // A 200 ms watchdog is checked every 50 ms: several keep-alives a second.
  EXPECT_GE(notify.count("WATCHDOG=1", milliseconds(1000)), 4);
  daemon->process().signal(SIGTERM);
  EXPECT_TRUE(notify.wait_for("STOPPING=1", milliseconds(10000)));
  EXPECT_EQ(daemon->process().wait_for(std::chrono::seconds(10)).value_or(-1), 0);
}

TEST(Systemd, AStoppedEngineThreadStopsTheWatchdog) {
  NotifySocket notify;
  auto daemon = start_notifying(notify);
  ASSERT_TRUE(notify.wait_for("READY=1", milliseconds(5000)));
  const pid_t engine = engine_thread(daemon->process().pid());
  ASSERT_GT(engine, 0) << "no thread named gsd-engine";
  // Stop the engine thread alone (the control thread, which talks to systemd, runs on).
  ASSERT_EQ(::ptrace(PTRACE_SEIZE, engine, nullptr, nullptr), 0) << std::strerror(errno);
  ASSERT_EQ(::ptrace(PTRACE_INTERRUPT, engine, nullptr, nullptr), 0) << std::strerror(errno);
  int status = 0;
  ASSERT_EQ(::waitpid(engine, &status, __WALL), engine);
  notify.count("WATCHDOG=1", milliseconds(200));  // what was on its way
  EXPECT_EQ(notify.count("WATCHDOG=1", milliseconds(1000)), 0)
      << "keep-alives went on while the engine thread was stopped";
  // gradsyncctl gets an answer all the same: that the engine does not answer.
  const auto asked = std::chrono::steady_clock::now();
  const CommandResult answer = run_command(tools::executable_dir() + "/gradsyncctl --socket " +
                                           daemon->socket_path() + " status 2>&1");
  EXPECT_EQ(answer.status, 1) << answer.out;
  EXPECT_NE(answer.out.find("the engine thread has not answered"), std::string::npos) << answer.out;
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(5));
  ASSERT_EQ(::ptrace(PTRACE_DETACH, engine, nullptr, nullptr), 0) << std::strerror(errno);
  EXPECT_TRUE(notify.wait_for("WATCHDOG=1", milliseconds(2000)))
      << "no keep-alive once the engine thread ran again";
}

TEST(Systemd, ReloadIsAnnouncedAndJournalLinesCarryPriorities) {
  NotifySocket notify;
  const auto log = std::filesystem::temp_directory_path() /
                   ("gradsync-journal-" + std::to_string(::getpid()) + ".log");
  std::ofstream(log).close();
  struct stat st {};
  ASSERT_EQ(::stat(log.c_str(), &st), 0);
  {
    // stderr appended to `log`, and JOURNAL_STREAM naming it, as systemd would for the journal.
    tools::PrivateDaemon daemon(
        tools::executable_dir() + "/gradsyncd", {"--log-level", "info"},
        {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>" + log.string()},
        {{"NOTIFY_SOCKET", notify.path()},
         {"JOURNAL_STREAM", std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino)}});
    ASSERT_TRUE(notify.wait_for("READY=1", milliseconds(5000)));
    daemon.process().signal(SIGHUP);
    EXPECT_TRUE(notify.wait_for("RELOADING=1", milliseconds(5000)));
    EXPECT_TRUE(notify.wait_for("READY=1", milliseconds(5000)));
    EXPECT_EQ(daemon.stop(), 0);
  }
  std::ifstream in(log);
  std::string line;
  int lines = 0;
  const std::regex journal_line(R"(<[0-7]>\[[a-z]+\] .*)");
  while (std::getline(in, line)) {
    EXPECT_TRUE(std::regex_match(line, journal_line)) << line;
    ++lines;
  }
  EXPECT_GT(lines, 2);
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace gradsync::testing
