#include "daemon/base/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace gradsync::daemon {
namespace {

// "<N>", the syslog priority journald reads at the start of a line (sd-daemon(3)).
class JournalPriority final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& message, const std::tm& /*time*/,
              spdlog::memory_buf_t& out) override {
    int priority = 6;  // info
    switch (message.level) {
      case spdlog::level::trace:
      case spdlog::level::debug:
        priority = 7;
        break;
      case spdlog::level::info:
        priority = 6;
        break;
      case spdlog::level::warn:
        priority = 4;
        break;
      case spdlog::level::err:
        priority = 3;
        break;
      case spdlog::level::critical:
        priority = 2;
        break;
      default:
        break;
    }
    const char text[] = {'<', static_cast<char>('0' + priority), '>'};
    out.append(text, text + sizeof(text));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JournalPriority>();
  }
};

}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& subsystem) {
  if (auto existing = spdlog::get(subsystem)) return existing;
  // Takes the registry's formatter and level (configure_logging).
  return spdlog::stderr_color_mt(subsystem);
}

void configure_logging(const std::string& level, bool journal) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  if (journal) {
    formatter->add_flag<JournalPriority>('*').set_pattern("%*[%n] %v");
  } else {
    formatter->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [%n] %v");
  }
  spdlog::set_formatter(std::move(formatter));
  set_log_level(level);
}

void set_log_level(const std::string& level) {
  spdlog::set_level(spdlog::level::from_str(level));
}

bool stderr_is_journal() {
  // systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the stream it connected; a daemon whose
  // stderr was redirected since is not writing to the journal.
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  struct stat st {};
  if (::fstat(2, &st) != 0) return false;
  unsigned long long device = 0;
  unsigned long long inode = 0;
  if (std::sscanf(stream, "%llu:%llu", &device, &inode) != 2) return false;
  return device == st.st_dev && inode == st.st_ino;
}

}  // namespace gradsync::daemon
