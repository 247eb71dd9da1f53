// Subsystem-tagged logging: each part of the daemon logs through its own named logger
// ("control", "engine", ...), so a line says where it came from.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace gradsync::daemon {

// The logger for `subsystem`, created on first use with the daemon's format and level.
std::shared_ptr<spdlog::logger> logger(const std::string& subsystem);

// How lines look: stamped with the time on a terminal or in a file; under systemd's journal,
// which stamps lines itself, with a syslog priority prefix for their level and no timestamp.
// Call before the first logger is made.
void configure_logging(const std::string& level, bool journal);
// Whether stderr is the journal stream systemd connected (JOURNAL_STREAM).
bool stderr_is_journal();

// Sets the level of every subsystem's logger, present and future.
void set_log_level(const std::string& level);

}  // namespace gradsync::daemon
