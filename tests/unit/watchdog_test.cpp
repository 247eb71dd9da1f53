// The rule that feeds systemd's watchdog: a keep-alive only for an engine that came round since
// it was last poked, checked every quarter interval.
#include "daemon/base/watchdog.h"

#include <gtest/gtest.h>

namespace gradsync::daemon {
namespace {

using std::chrono::milliseconds;
using Verdict = EngineWatchdog::Verdict;

TEST(EngineWatchdog, KeepsAliveOnlyWhileTheEngineComesRound) {
  const auto t0 = EngineWatchdog::Clock::now();
  EngineWatchdog watchdog(milliseconds(400), t0);
  EXPECT_EQ(watchdog.poll_timeout_ms(), 100);
  // The engine beat after start: alive at the first check, a quarter interval in.
  EXPECT_EQ(watchdog.check(t0 + milliseconds(50), t0 + milliseconds(10)), Verdict::kNotYet);
  EXPECT_EQ(watchdog.check(t0 + milliseconds(100), t0 + milliseconds(10)), Verdict::kAlive);
  // Poked at 100 ms, it answered at 101 ms.
  EXPECT_EQ(watchdog.check(t0 + milliseconds(200), t0 + milliseconds(101)), Verdict::kAlive);
  // Poked at 200 ms and silent since: no keep-alive, however often it is checked.
  EXPECT_EQ(watchdog.check(t0 + milliseconds(300), t0 + milliseconds(101)), Verdict::kEngineSilent);
  EXPECT_EQ(watchdog.check(t0 + milliseconds(400), t0 + milliseconds(101)), Verdict::kEngineSilent);
  // It comes back.
  EXPECT_EQ(watchdog.check(t0 + milliseconds(500), t0 + milliseconds(450)), Verdict::kAlive);
}

TEST(EngineWatchdog, DisabledWithoutAnInterval) {
  EngineWatchdog watchdog(std::chrono::microseconds(0), EngineWatchdog::Clock::now());
  EXPECT_FALSE(watchdog.enabled());
  EXPECT_EQ(watchdog.poll_timeout_ms(), -1);
  EXPECT_EQ(watchdog.check(EngineWatchdog::Clock::now() + std::chrono::hours(1),
                           EngineWatchdog::Clock::now()),
            Verdict::kNotYet);
}

}  // namespace
}  // namespace gradsync::daemon
