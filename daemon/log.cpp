#include "daemon/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace gradsync::daemon {

std::shared_ptr<spdlog::logger> logger(const std::string& subsystem) {
  if (auto existing = spdlog::get(subsystem)) return existing;
  auto created = spdlog::stderr_color_mt(subsystem);
  created->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [%n] %v");
  created->set_level(spdlog::get_level());
  return created;
}

void set_log_level(const std::string& level) {
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace gradsync::daemon
