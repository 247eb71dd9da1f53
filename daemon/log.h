// Subsystem-tagged logging: each part of the daemon logs through its own named logger
// ("control", "engine", ...), so a line says where it came from.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace gradsync::daemon {

// The logger for `subsystem`, created on first use with the daemon's pattern and level.
std::shared_ptr<spdlog::logger> logger(const std::string& subsystem);

// Sets the level of every subsystem's logger, present and future.
void set_log_level(const std::string& level);

}  // namespace gradsync::daemon
