#include "daemon/engine/reduce_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <vector>

namespace gradsync::daemon {
namespace {

// The calling thread's CPU affinity, set for a scope and restored after it.
class AffinityForScope {
 public:
  explicit AffinityForScope(const cpu_set_t& cpus) {
    EXPECT_EQ(::sched_getaffinity(0, sizeof(saved_), &saved_), 0);
    EXPECT_EQ(::sched_setaffinity(0, sizeof(cpus), &cpus), 0);
  }
  ~AffinityForScope() { ::sched_setaffinity(0, sizeof(saved_), &saved_); }
  AffinityForScope(const AffinityForScope&) = delete;
  AffinityForScope& operator=(const AffinityForScope&) = delete;

 private:
  cpu_set_t saved_{};
};

TEST(ReducePool, ByDefaultHasAThreadPerCpuItMayRunOn) {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  EXPECT_EQ(ReducePool(0).size(), static_cast<unsigned>(CPU_COUNT(&cpus)));

  // Confined to one CPU (a service's CPUAffinity, a taskset): no threads to take turns on it.
  int first = 0;
  while (!CPU_ISSET(first, &cpus)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  const AffinityForScope confined(one);
  EXPECT_EQ(ReducePool(0).size(), 1U);
  EXPECT_EQ(ReducePool(3).size(), 3U);  // asked for: as many as asked
}

TEST(ReducePool, RunsEveryPartOnce) {
  ReducePool pool(3);
  std::vector<std::atomic<int>> runs(3);
  for (int round = 0; round < 100; ++round) {
    pool.run(3, [&](unsigned part) { runs[part].fetch_add(1); });
  }
  for (const auto& count : runs) EXPECT_EQ(count.load(), 100);
  pool.run(1, [&](unsigned part) { runs[part].fetch_add(1); });
  EXPECT_EQ(runs[0].load(), 101);
}

}  // namespace
}  // namespace gradsync::daemon
