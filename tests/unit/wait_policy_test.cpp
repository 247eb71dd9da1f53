#include "client/wait_policy.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace gradsync::client {
namespace {

cpu_set_t cpus(std::initializer_list<int> list) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : list) CPU_SET(cpu, &set);
  return set;
}

TEST(WaitPolicy, SpinsUnlessTheRankAndItsDaemonShareOneCpu) {
  EXPECT_FALSE(spinning_pays(cpus({0}), cpus({0})));
  EXPECT_FALSE(spinning_pays(cpus({3}), cpus({3})));
  EXPECT_TRUE(spinning_pays(cpus({0}), cpus({1})));
  EXPECT_TRUE(spinning_pays(cpus({0}), cpus({0, 1})));
  EXPECT_TRUE(spinning_pays(cpus({0, 1}), cpus({0, 1})));
}

TEST(WaitPolicy, ReadsTheCpuSetsOfThisThreadAndTheDaemon) {
  cpu_set_t allowed;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int first = 0;
  while (!CPU_ISSET(first, &allowed)) ++first;
  // This thread stands in for both: pinned to one CPU, it and "its daemon" share that one.
  const cpu_set_t one = cpus({first});
  ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
  const auto pinned = spin_before_sleeping(::gettid());
  ASSERT_EQ(::sched_setaffinity(0, sizeof(allowed), &allowed), 0);
  EXPECT_EQ(pinned.count(), 0);
  EXPECT_EQ(spin_before_sleeping(::gettid()),
            CPU_COUNT(&allowed) > 1 ? kYieldingSpin : std::chrono::microseconds(0));
  // Unknown daemon: spin, as before this policy.
  EXPECT_EQ(spin_before_sleeping(0), kYieldingSpin);
}

}  // namespace
}  // namespace gradsync::client
