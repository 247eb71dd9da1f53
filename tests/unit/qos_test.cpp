// Shares between jobs (docs/qos.md): the fair order, the pacer of inter-node sends and the
// rules, against exact expected orders on a clock the tests set.
#include "daemon/base/config.h"
#include "daemon/qos/fair_share.h"
#include "daemon/qos/policy.h"
#include "daemon/qos/priority.h"
#include "daemon/qos/wire_pacer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>
#include <vector>

namespace gradsync::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = WirePacer::Clock;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

// Serves equal pieces to always-backlogged flows; the order as letters (flow 0 = 'A').
std::string fair_order(FairShare& share, size_t flows, size_t servings) {
  std::vector<FairShare::Flow> backlogged;
  for (size_t f = 0; f < flows; ++f) backlogged.push_back(f);
  std::string order;
  for (size_t i = 0; i < servings; ++i) {
    const FairShare::Flow flow = *share.pick(backlogged);
    share.charge(flow, kMiB);
    order += static_cast<char>('A' + flow);
  }
  return order;
}

TEST(FairShare, BacklogsAreServedInTheRatioOfTheirWeights) {
  FairShare share;
  share.set_weight(0, 3);
  share.set_weight(1, 1);
  EXPECT_EQ(fair_order(share, 2, 13), "ABAAABAAABAAA");
}

TEST(FairShare, EqualWeightsAlternateAndAFlowAloneIsAlwaysServed) {
  FairShare share;
  EXPECT_EQ(fair_order(share, 2, 6), "ABABAB");
  EXPECT_EQ(fair_order(share, 1, 4), "AAAA");
}

TEST(FairShare, IdleTimeEarnsNoCredit) {
  FairShare share;
  // A is served alone for a while; B, back after being idle, is not owed all that time: it
  // starts at the current virtual time, one serving ahead of A.
  for (int i = 0; i < 10; ++i) {
    const std::vector<FairShare::Flow> only_a = {0};
    share.charge(*share.pick(only_a), kMiB);
  }
  EXPECT_EQ(fair_order(share, 2, 6), "BABABA");
}

TEST(FairShare, AWeightChangeHoldsFromTheNextServing) {
  FairShare share;
  EXPECT_EQ(fair_order(share, 2, 4), "ABAB");
  share.set_weight(1, 3);
  EXPECT_EQ(fair_order(share, 2, 8), "ABBBABBB");
}

// Requests and their grants, in the order the tests take them.
struct Grants {
  std::vector<std::pair<WirePacer::Flow, WirePacer::Ticket>> waiting;
  std::string order;
  // Takes every grant (the tests let each dispatch grant one flow's), in request order.
  void collect(WirePacer& pacer) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (pacer.take_grant(it->second)) {
        order += static_cast<char>('A' + it->first);
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
  }
};

TEST(WirePacer, AJobAloneIsGrantedAtOnceWhateverTheTransportHolds) {
  WirePacer pacer(4 * kMiB);
  pacer.set_share(0, JobShare{});
  const auto now = Clock::now();
  Grants grants;
  for (int i = 0; i < 8; ++i) grants.waiting.emplace_back(0, pacer.request(0, 4 * kMiB, now));
  pacer.dispatch(now, {64 * kMiB});
  grants.collect(pacer);
  EXPECT_EQ(grants.order, "AAAAAAAA");
}

TEST(WirePacer, ContendedGrantsFollowTheWeightsAndTheWindow) {
  // A window of one piece: each dispatch grants one while the transport holds nothing.
  WirePacer pacer(kMiB);
  pacer.set_share(0, JobShare{3});
  pacer.set_share(1, JobShare{1});
  auto now = Clock::now();
  Grants grants;
  for (int i = 0; i < 12; ++i) grants.waiting.emplace_back(0, pacer.request(0, kMiB, now));
  for (int i = 0; i < 4; ++i) grants.waiting.emplace_back(1, pacer.request(1, kMiB, now));
  for (int round = 0; round < 16; ++round) {
    now += 1ms;
    pacer.dispatch(now, {0});
    grants.collect(pacer);
    // Nothing more while the transport still holds a piece.
    pacer.dispatch(now, {kMiB});
    grants.collect(pacer);
  }
  EXPECT_EQ(grants.order, "ABAAABAAABAAABAA");
  EXPECT_EQ(pacer.counters(0, now).granted_bytes, 12 * kMiB);
  EXPECT_EQ(pacer.counters(1, now).granted_bytes, 4 * kMiB);
  EXPECT_GT(pacer.counters(1, now).waited_seconds, 0);
}

TEST(WirePacer, AWindowThatNeverDrainsStillLetsOneSendGoNowAndThen) {
  WirePacer pacer(kMiB);
  auto now = Clock::now();
  Grants grants;
  for (int i = 0; i < 3; ++i) grants.waiting.emplace_back(0, pacer.request(0, kMiB, now));
  grants.waiting.emplace_back(1, pacer.request(1, kMiB, now));
  pacer.dispatch(now, {0});
  grants.collect(pacer);
  EXPECT_EQ(grants.order, "A");
  pacer.dispatch(now + WirePacer::kStalledWindow / 2, {8 * kMiB});
  grants.collect(pacer);
  EXPECT_EQ(grants.order, "A");
  pacer.dispatch(now + WirePacer::kStalledWindow, {8 * kMiB});
  grants.collect(pacer);
  EXPECT_EQ(grants.order, "AB");
}

TEST(WirePacer, ACapHoldsTheRateWhateverTheMessageSize) {
  WirePacer pacer(64 * kMiB);
  // 1 MB/s; 100 kB messages: one every 100 ms, the first at once from the burst.
  pacer.set_share(0, JobShare{1, 1e6});
  const auto start = Clock::now();
  Grants grants;
  std::vector<int> granted_at_ms;
  for (int ms = 0; ms <= 1000; ++ms) {
    const auto now = start + std::chrono::milliseconds(ms);
    while (grants.waiting.size() < 2)
      grants.waiting.emplace_back(0, pacer.request(0, 100'000, now));
    pacer.dispatch(now, {0});
    const size_t before = grants.order.size();
    grants.collect(pacer);
    if (grants.order.size() > before) granted_at_ms.push_back(ms);
  }
  // The burst (10 ms at the cap) is 10 kB: the first grant leaves 90 kB of debt.
  EXPECT_EQ(granted_at_ms, (std::vector<int>{0, 90, 190, 290, 390, 490, 590, 690, 790, 890, 990}));
}

TEST(WirePacer, ALatencyClassJobsSmallSendsGoFirstPastTheWindow) {
  WirePacer pacer(kMiB);
  pacer.set_share(0, JobShare{1});
  pacer.set_share(1, JobShare{1, 0, true});
  auto now = Clock::now();
  pacer.note_collective(1, now);
  Grants grants;
  // With an active latency-class job on the node, a bulk job is held by the window even alone.
  for (int i = 0; i < 3; ++i) grants.waiting.emplace_back(0, pacer.request(0, kMiB, now));
  pacer.dispatch(now, {0});
  grants.collect(pacer);
  EXPECT_EQ(grants.order, "A");
  // The latency-class job's 8 B go at once, past the full window; its 1 MiB waits for the
  // window like any bulk piece, and goes first (A has been served more).
  grants.waiting.emplace_back(1, pacer.request(1, 8, now));
  grants.waiting.emplace_back(1, pacer.request(1, kMiB, now));
  now += 1ms;
  pacer.dispatch(now, {kMiB});
  grants.collect(pacer);
  EXPECT_EQ(grants.order, "AB");
  now += 1ms;
  pacer.dispatch(now, {0});
  grants.collect(pacer);
  EXPECT_EQ(grants.order, "ABB");
  now += 1ms;
  pacer.dispatch(now, {0});
  grants.collect(pacer);
  EXPECT_EQ(grants.order, "ABBA");
}

TEST(WirePacer, ALatencyClassJobKeepsTheOthersBelowTheLink) {
  WirePacer pacer(64 * kMiB);
  // Sampled at 1.1 MB/s: the link carries 1 MB/s.
  pacer.set_link_rate(WirePacer::kLinkHeadroom * 1e6);
  pacer.set_share(0, JobShare{1});
  pacer.set_share(1, JobShare{1, 0, true});  // never sends in pieces: its collectives are small
  const auto start = Clock::now();
  pacer.note_collective(1, start);
  uint64_t granted = 0;
  for (int ms = 0; ms < 1000; ++ms) {
    const WirePacer::Ticket ticket =
        pacer.request(0, 10'000, start + std::chrono::milliseconds(ms));
    pacer.dispatch(start + std::chrono::milliseconds(ms), {0});
    if (pacer.take_grant(ticket)) {
      granted += 10'000;
    } else {
      pacer.cancel(ticket);
    }
  }
  // kLatencyLoad of the link for a second, and the first send at once on its burst.
  EXPECT_EQ(granted, static_cast<uint64_t>(WirePacer::kLatencyLoad * 1e6) + 10'000);
}

// A latency-class job idle for longer than kLatencyActiveFor holds nobody back; its next
// collective does again.
TEST(WirePacer, AnIdleLatencyClassJobCostsTheOthersNothing) {
  WirePacer pacer(64 * kMiB);
  pacer.set_link_rate(WirePacer::kLinkHeadroom * 1e6);
  pacer.set_share(0, JobShare{1});
  pacer.set_share(1, JobShare{1, 0, true});
  const auto start = Clock::now();
  pacer.note_collective(1, start);
  const auto granted_at_once = [&pacer](Clock::time_point now) {
    std::vector<WirePacer::Ticket> tickets(10);
    for (WirePacer::Ticket& ticket : tickets) ticket = pacer.request(0, 100'000, now);
    pacer.dispatch(now, {0});
    size_t granted = 0;
    for (const WirePacer::Ticket ticket : tickets) {
      if (pacer.take_grant(ticket)) {
        ++granted;
      } else {
        pacer.cancel(ticket);
      }
    }
    return granted;
  };
  EXPECT_EQ(granted_at_once(start + 1s), 1u) << "paced below the link: one send on its burst";
  const auto idle = start + WirePacer::kLatencyActiveFor + 1s;
  EXPECT_EQ(granted_at_once(idle), 10u) << "alone again: every send at once";
  pacer.note_collective(1, idle + 1s);
  EXPECT_EQ(granted_at_once(idle + 1s), 1u);
}

// The transport's load as a job alone that fills the link leaves it: held past the backlog
// all the time, and `rate` bytes a second finished.
transport::SendLoad backlogged_load(Clock::time_point start, Clock::time_point now, double rate) {
  const double seconds = std::chrono::duration<double>(now - start).count();
  return {8 * kMiB, static_cast<uint64_t>(rate * seconds), seconds};
}

TEST(WirePacer, AJobAloneThatFillsTheLinkGivesItsFigure) {
  WirePacer pacer(kMiB);
  const auto start = Clock::now();
  const auto interval = WirePacer::kBacklogInterval;
  pacer.dispatch(start, backlogged_load(start, start, 0));
  // One backlogged interval is not enough: its first sends may have gone into socket buffers.
  pacer.dispatch(start + interval, backlogged_load(start, start + interval, 20e6));
  EXPECT_EQ(pacer.link_rate(), 0);
  pacer.dispatch(start + 2 * interval, backlogged_load(start, start + 2 * interval, 20e6));
  EXPECT_DOUBLE_EQ(pacer.link_rate(), WirePacer::kLinkHeadroom * 20e6);
  // A link that carries less later: the figure follows it down.
  const double seconds = std::chrono::duration<double>(interval).count();
  transport::SendLoad load{8 * kMiB, static_cast<uint64_t>((2 * 20e6 + 15e6) * seconds),
                           3 * seconds};
  pacer.dispatch(start + 3 * interval, load);
  EXPECT_NEAR(pacer.link_rate(), WirePacer::kLinkHeadroom * 15e6, 1);
  // A stall behind the backlog (a peer cut off): less than a window delivered, no figure.
  load.delivered_bytes += kMiB / 2;
  load.backlogged_seconds += seconds;
  pacer.dispatch(start + 4 * interval, load);
  EXPECT_NEAR(pacer.link_rate(), WirePacer::kLinkHeadroom * 15e6, 1);
  // Much less, but more than a window: half the figure at most in one sample.
  load.delivered_bytes += 2 * kMiB;
  load.backlogged_seconds += seconds;
  pacer.dispatch(start + 5 * interval, load);
  EXPECT_NEAR(pacer.link_rate(), WirePacer::kLinkHeadroom * 15e6 / 2, 1);
}

TEST(WirePacer, SendsTheLinkTookAtOnceGiveNoFigure) {
  WirePacer pacer(kMiB);
  const auto start = Clock::now();
  const auto interval = WirePacer::kBacklogInterval;
  // Held below the backlog for half of each interval: the network took what it was given.
  for (int i = 0; i <= 4; ++i) {
    const double seconds = std::chrono::duration<double>(i * interval).count();
    pacer.dispatch(start + i * interval, {0, static_cast<uint64_t>(5e6 * seconds), seconds / 2});
  }
  EXPECT_EQ(pacer.link_rate(), 0);
}

// Two jobs that sent less than the figure may have had less to send: they never lower it.
TEST(WirePacer, SharedJobsSendingLittleKeepTheFigure) {
  WirePacer pacer(64 * kMiB);
  pacer.set_link_rate(10e6);
  const auto start = Clock::now();
  pacer.sample(start);
  for (WirePacer::Flow flow = 0; flow < 2; ++flow) {
    const WirePacer::Ticket ticket = pacer.request(flow, 1000, start);
    pacer.dispatch(start, {0});
    EXPECT_TRUE(pacer.take_grant(ticket));
  }
  pacer.sample(start + 1s);
  EXPECT_DOUBLE_EQ(pacer.link_rate(), 10e6);
}

TEST(WirePacer, ACancelledRequestIsNeverGranted) {
  WirePacer pacer(kMiB);
  const auto now = Clock::now();
  const WirePacer::Ticket first = pacer.request(0, kMiB, now);
  const WirePacer::Ticket second = pacer.request(0, kMiB, now);
  pacer.cancel(first);
  pacer.dispatch(now, {0});
  EXPECT_FALSE(pacer.take_grant(first));
  EXPECT_TRUE(pacer.take_grant(second));
  EXPECT_EQ(pacer.waiting(), 0u);
  pacer.remove(0);
  EXPECT_EQ(pacer.counters(0, now).granted_bytes, 0u);
}

TEST(QosPolicy, TheFirstMatchingRuleApplies) {
  const DaemonConfig config =
      parse_config("[[qos.rule]]\njob = \"bulk-[ab]*\"\nuser = " + std::to_string(::getuid()) +
                       "\nweight = 3\nmax_gbit_per_s = 0.5\n"
                       "[[qos.rule]]\njob = \"bulk-*\"\nweight = 2\n"
                       "[[qos.rule]]\njob = \"probe-?\"\nlatency_class = true\n",
                   "test");
  ASSERT_EQ(config.qos_rules.size(), 3u);
  EXPECT_EQ(share_for(config.qos_rules, "bulk-a1", ::getuid()), (JobShare{3, 0.5e9 / 8, false, 1}));
  EXPECT_EQ(share_for(config.qos_rules, "bulk-a1", ::getuid() + 1), (JobShare{2, 0, false, 2}));
  EXPECT_EQ(share_for(config.qos_rules, "bulk-c", ::getuid()), (JobShare{2, 0, false, 2}));
  EXPECT_EQ(share_for(config.qos_rules, "probe-1", 0), (JobShare{1, 0, true, 3}));
  EXPECT_EQ(share_for(config.qos_rules, "probe-12", 0), JobShare{});
  // Written back as one key, read back the same.
  EXPECT_EQ(parse_config(to_toml(config), "again").qos_rules, config.qos_rules);
}

TEST(QosPolicy, BadRulesAreRefusedNamingTheKey) {
  const auto error_of = [](const std::string& toml) {
    try {
      parse_config(toml, "test");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // Each bad configuration, and what its error must say.
  const std::pair<const char*, const char*> cases[] = {
      {"[[qos.rule]]\nweigth = 2\n", "'qos.rule[1].weigth': unknown key"},
      {"[[qos.rule]]\n[[qos.rule]]\nweight = -1\n", "'qos.rule[2].weight'"},
      {"[[qos.rule]]\nweight = 0\n", "outside (0,"},
      {"[[qos.rule]]\njob = \"bulk-[a\"\n", "is not closed"},
      {"[[qos.rule]]\nuser = \"no-such-user-here\"\n", "no user"},
      {"[[qos.rule]]\nmax_gbit_per_s = \"fast\"\n", "expected a number"},
      {"[qos]\nrules = 1\n", "'qos.rules': unknown key"},
      {"qos = 3\n", "'qos'"},
  };
  for (const auto& [toml, says] : cases) EXPECT_THAT(error_of(toml), HasSubstr(says)) << toml;
}

}  // namespace
}  // namespace gradsync::daemon

namespace gradsync::daemon {
namespace {

TEST(WirePacer, SharedJobsGetTheirPartsOfTheLinksRate) {
  WirePacer pacer(64 * kMiB);
  pacer.set_link_rate(4e6);
  pacer.set_share(0, JobShare{3});
  pacer.set_share(1, JobShare{1});
  const auto start = Clock::now();
  pacer.sample(start);
  Grants grants;
  uint64_t granted[2] = {0, 0};
  for (int ms = 0; ms < 1000; ++ms) {
    const auto now = start + std::chrono::milliseconds(ms);
    for (WirePacer::Flow flow = 0; flow < 2; ++flow) {
      size_t waiting = 0;
      for (const auto& w : grants.waiting) waiting += w.first == flow;
      if (waiting == 0) grants.waiting.emplace_back(flow, pacer.request(flow, 100'000, now));
    }
    pacer.dispatch(now, {0});
    const std::string before = grants.order;
    grants.collect(pacer);
    for (size_t i = before.size(); i < grants.order.size(); ++i)
      granted[grants.order[i] - 'A'] += 100'000;
  }
  // 3 MB/s and 1 MB/s for a second, and each job's first send at once on its burst.
  EXPECT_EQ(granted[0], 3'100'000u);
  EXPECT_EQ(granted[1], 1'100'000u);
  // Held back by the pacer alone (the transport took everything), the jobs sent what it let
  // them: its figure for the link grows past that, and with it their parts.
  pacer.sample(start + 1s);
  EXPECT_DOUBLE_EQ(pacer.link_rate(), WirePacer::kLinkHeadroom * 4.2e6);
}

TEST(Priority, HigherPrioritiesRankFirstAndEqualOnesKeepTheirOrder) {
  EXPECT_GT(priority_rank(1, 7), priority_rank(0, 7));
  EXPECT_GT(priority_rank(0, 7), priority_rank(0, 8)) << "the older first";
  EXPECT_GT(priority_rank(-3, 0), priority_rank(-4, 0));
}

TEST(Priority, AWaitingCollectiveAgesPastLaterHigherOnes) {
  // Priority 0, queued 10th; priority 2 ones queued after it outrank it until 32 came after.
  const int64_t low = priority_rank(0, 10);
  EXPECT_GT(priority_rank(2, 10 + 2 * kPriorityAgingStep - 1), low);
  EXPECT_EQ(priority_rank(2, 10 + 2 * kPriorityAgingStep), low);
  EXPECT_LT(priority_rank(2, 10 + 2 * kPriorityAgingStep + 1), low);
}

TEST(Priority, OnlyAnotherPriorityHoldsACollectiveBack) {
  const Ranked low{0, priority_rank(0, 4)};
  EXPECT_TRUE(low.held_back_by({3, priority_rank(3, 5)}));
  EXPECT_FALSE(low.held_back_by({0, priority_rank(0, 3)})) << "one priority runs together";
  EXPECT_FALSE(low.held_back_by({3, priority_rank(3, 4 + 3 * kPriorityAgingStep + 1)}));
  EXPECT_FALSE((Ranked{3, priority_rank(3, 5)}).held_back_by(low));
}

}  // namespace
}  // namespace gradsync::daemon
