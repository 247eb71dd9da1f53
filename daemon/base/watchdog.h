// systemd's watchdog, fed only while the engine thread comes round. The control thread checks
// every quarter of the interval that the engine has come round its loop since the last
// check poked it awake, and pokes it again: a keep-alive goes out only for an engine that
// answered. A stuck engine (a loop that never returns, a deadlock) stops the keep-alives and
// systemd restarts the daemon, while the control thread alone would have kept them coming.
#pragma once

#include <chrono>

namespace gradsync::daemon {

class EngineWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // `interval`: systemd's (WATCHDOG_USEC); zero disables the watchdog.
  EngineWatchdog(std::chrono::microseconds interval, Clock::time_point now)
      : interval_(interval), last_check_(now), last_poke_(now) {}

  bool enabled() const { return interval_.count() > 0; }
  // How often the control thread must wake to check; -1 (no timeout) when disabled.
  int poll_timeout_ms() const {
    return enabled() ? static_cast<int>(std::max<int64_t>(1, interval_.count() / 4000)) : -1;
  }

  enum class Verdict {
    kNotYet,        // checked less than a quarter interval ago
    kAlive,         // the engine came round since the last poke: send a keep-alive
    kEngineSilent,  // it did not: send none
  };
  // `engine_beat`: when the engine last came round its loop. After kAlive or
  // kEngineSilent the caller pokes the engine awake.
  Verdict check(Clock::time_point now, Clock::time_point engine_beat) {
    if (!enabled() || now - last_check_ < interval_ / 4) return Verdict::kNotYet;
    last_check_ = now;
    const bool alive = engine_beat >= last_poke_;
    last_poke_ = now;
    return alive ? Verdict::kAlive : Verdict::kEngineSilent;
  }

 private:
  std::chrono::microseconds interval_;
  Clock::time_point last_check_;
  Clock::time_point last_poke_;
};

}  // namespace gradsync::daemon
