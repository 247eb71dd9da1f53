// The negotiation among node daemons, driven over an in-process network of messages that keeps
// each sender's order per receiver (as UCX does per endpoint) but interleaves senders at
// random. Every node must decide the same collectives in the same order, however the nodes'
// ranks get ready.
#include "daemon/node/negotiator.h"
#include "ipc/messages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <tuple>

namespace gradsync::daemon {
namespace {

// A decision with its name's key, as a test compares them.
struct Decided {
  std::string key;
  std::string error;
  uint64_t cookie = 0;
};

// With `hold`, nodes hold back empty parts of their peers' cycles (Negotiator, "holding a
// join"); deliver_all then releases a hold once nothing else can move, as the daemon does
// after a bounded wait.
class Network {
 public:
  // Node n measured link_of(n); by default, figures that differ only in latency.
  Network(uint32_t nodes, uint32_t capacity, uint64_t seed, bool hold = false,
          const std::function<cost_model::LinkFigures(uint32_t)>& link_of = {},
          CycleRoute route = CycleRoute::kDirect)
      : random_(seed), sent_(nodes, 0) {
    for (uint32_t n = 0; n < nodes; ++n) {
      negotiators_.push_back(std::make_unique<Negotiator>(
          "job", nodes, n, "ranks " + std::to_string(n), capacity,
          link_of ? link_of(n) : cost_model::LinkFigures{1e-5 * (n + 1), 1e-9, 1e-10},
          [this, n](uint32_t to, capnp::MessageBuilder& message) {
            EXPECT_NE(to, n) << "a node sent itself a message";
            measure(message.getRoot<wire::NodeMessage>().asReader());
            queues_[{n, to}].push_back(ipc::encode(message));
            ++sent_[n];
          },
          hold, route));
    }
  }

  Negotiator& node(uint32_t n) { return *negotiators_[n]; }
  uint32_t nodes() const { return static_cast<uint32_t>(negotiators_.size()); }
  // The cycle messages (direct or relayed) node `n` has sent.
  uint64_t cycle_messages_sent(uint32_t n) const { return sent_[n]; }
  // The most reports of uncached names, and bytes of contributions, one message carried.
  size_t most_reports() const { return most_reports_; }
  size_t most_eager_bytes() const { return most_eager_bytes_; }

  // Delivers every message, one at a time from a random non-empty sender queue; when none is
  // left, releases the holds.
  void deliver_all() {
    while (true) {
      std::vector<std::pair<uint32_t, uint32_t>> ready;
      for (auto& [link, queue] : queues_) {
        if (!queue.empty()) ready.push_back(link);
      }
      if (ready.empty()) {
        const auto held = std::find_if(negotiators_.begin(), negotiators_.end(),
                                       [](const auto& n) { return n->holding(); });
        if (held == negotiators_.end()) return;
        (*held)->release_hold();
        continue;
      }
      const auto link = ready[random_() % ready.size()];
      const std::vector<uint8_t> bytes = std::move(queues_[link].front());
      queues_[link].pop_front();
      dispatch(link.first, link.second, bytes);
    }
  }

  // Delivers the oldest message from `from` to `to`.
  void deliver_one(uint32_t from, uint32_t to) {
    auto& queue = queues_[{from, to}];
    ASSERT_FALSE(queue.empty());
    const std::vector<uint8_t> bytes = std::move(queue.front());
    queue.pop_front();
    dispatch(from, to, bytes);
  }

  // What each node decided since the last call, cycle by cycle.
  std::vector<std::vector<CycleDecisions>> take_cycles() {
    std::vector<std::vector<CycleDecisions>> all;
    for (auto& n : negotiators_) {
      all.emplace_back(std::make_move_iterator(n->decided().begin()),
                       std::make_move_iterator(n->decided().end()));
      n->decided().clear();
    }
    return all;
  }

  // What each node decided since the last call, named.
  std::vector<std::vector<Decided>> take_decisions() {
    std::vector<std::vector<Decided>> all;
    const auto cycles = take_cycles();
    for (uint32_t n = 0; n < nodes(); ++n) {
      auto& decisions = all.emplace_back();
      for (const auto& cycle : cycles[n]) {
        for (const Decision& d : cycle.decisions) {
          decisions.push_back({node(n).name(d.name), d.error, d.cookie});
        }
      }
    }
    return all;
  }

 private:
  void measure(wire::NodeMessage::Reader message) {
    size_t reports = 0;
    size_t eager = 0;
    auto add = [&](wire::Cycle::Reader cycle) {
      reports += cycle.getUncached().size();
      eager += cycle.getEagerData().size();
    };
    if (message.isCycle()) add(message.getCycle());
    if (message.isRelay()) {
      for (const auto part : message.getRelay()) add(part.getCycle());
    }
    most_reports_ = std::max(most_reports_, reports);
    most_eager_bytes_ = std::max(most_eager_bytes_, eager);
  }

  void dispatch(uint32_t from, uint32_t to, const std::vector<uint8_t>& bytes) {
    ipc::DecodedMessage decoded(bytes, kNodeMessageLimitWords);  // as the engine reads them
    const auto message = decoded.root<wire::NodeMessage>();
    if (message.isCycle()) node(to).on_cycle(from, message.getCycle());
    if (message.isRelay()) node(to).on_relay(from, message.getRelay());
  }

  std::mt19937_64 random_;
  std::vector<std::unique_ptr<Negotiator>> negotiators_;
  std::map<std::pair<uint32_t, uint32_t>, std::deque<std::vector<uint8_t>>> queues_;
  std::vector<uint64_t> sent_;  // by node
  size_t most_reports_ = 0;
  size_t most_eager_bytes_ = 0;
};

Proposal allreduce(const std::string& name, uint64_t count) {
  Proposal p;
  p.key = name;
  p.signature.collective = ipc::Collective::kAllreduce;
  p.signature.count = count;
  return p;
}

std::vector<std::string> keys(const std::vector<Decided>& decisions) {
  std::vector<std::string> k;
  k.reserve(decisions.size());
  for (const auto& d : decisions) k.push_back(d.key);
  return k;
}

// Every node proposes `names` in its own random order, with deliveries interleaved; returns
// the decisions, checked identical on every node.
std::vector<Decided> run_step(Network& net, const std::vector<std::string>& names,
                              std::mt19937_64& random, uint64_t count = 100) {
  std::vector<std::vector<std::string>> orders(net.nodes(), names);
  for (auto& order : orders) std::shuffle(order.begin(), order.end(), random);
  for (size_t i = 0; i < names.size(); ++i) {
    for (uint32_t n = 0; n < net.nodes(); ++n) net.node(n).propose(allreduce(orders[n][i], count));
    if (random() % 3 == 0) net.deliver_all();
  }
  net.deliver_all();
  auto decisions = net.take_decisions();
  for (uint32_t n = 1; n < net.nodes(); ++n) {
    EXPECT_EQ(keys(decisions[n]), keys(decisions[0])) << "node " << n << " decided differently";
  }
  return decisions[0];
}

std::vector<std::string> tensor_names(int count) {
  std::vector<std::string> names;
  names.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) names.push_back("grad." + std::to_string(i));
  return names;
}

// Node counts, each with joins held and not, each with cycles sent to every node and relayed.
class NegotiatorTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool, CycleRoute>> {
 protected:
  static uint32_t nodes() { return std::get<0>(GetParam()); }
  static bool hold() { return std::get<1>(GetParam()); }
  static CycleRoute route() { return std::get<2>(GetParam()); }
};

TEST_P(NegotiatorTest, FirstStepByReportsLaterStepsFromTheCache) {
  std::mt19937_64 random(nodes());
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  const auto names = tensor_names(40);
  auto first = run_step(net, names, random);
  ASSERT_EQ(first.size(), names.size());
  for (int step = 0; step < 5; ++step) {
    auto decided = run_step(net, names, random);
    auto sorted = keys(decided);
    std::sort(sorted.begin(), sorted.end());
    auto expected = names;
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(sorted, expected);
  }
  EXPECT_EQ(net.node(0).counters().cache_hits, 5u * names.size());
  EXPECT_EQ(net.node(0).counters().cache_misses, names.size());
  // Every node agrees on the largest link figures.
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    EXPECT_DOUBLE_EQ(net.node(n).agreed_link().alpha_seconds, 1e-5 * nodes());
  }
}

TEST_P(NegotiatorTest, AChangedSizeIsRenegotiatedEverywhere) {
  std::mt19937_64 random(nodes());
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  const auto names = tensor_names(8);
  run_step(net, names, random, 100);
  run_step(net, names, random, 100);
  const uint64_t misses = net.node(0).counters().cache_misses;
  auto decided = run_step(net, names, random, 200);
  EXPECT_EQ(decided.size(), names.size());
  for (const auto& d : decided) EXPECT_EQ(d.error, "") << d.key;
  EXPECT_EQ(net.node(0).counters().cache_misses, misses + names.size());
  EXPECT_EQ(net.node(0).cache().find("grad.0")->signature, allreduce("grad.0", 200).signature);
}

TEST_P(NegotiatorTest, AMismatchFailsOnEveryNodeNamingTheNodes) {
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  const uint32_t last = nodes() - 1;
  for (uint32_t n = 0; n < net.nodes(); ++n) net.node(n).propose(allreduce("w", n == last ? 7 : 5));
  net.deliver_all();
  auto decisions = net.take_decisions();
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    ASSERT_EQ(decisions[n].size(), 1u);
    EXPECT_NE(decisions[n][0].error.find("tensor 'w'"), std::string::npos);
    EXPECT_NE(decisions[n][0].error.find("node " + std::to_string(last) +
                                         " has allreduce, count 7, float32, sum (ranks " +
                                         std::to_string(last) + ")"),
              std::string::npos)
        << decisions[n][0].error;
  }
  EXPECT_EQ(net.node(0).cache().size(), 0u);  // a failed collective is not cached
}

// Device collectives are staged and never fused or sent eagerly: the nodes must agree that a
// tensor is on device memory, as on its size (it crosses the wire with the proposal).
TEST_P(NegotiatorTest, DeviceMemoryOnOneNodeAndHostMemoryOnAnotherIsAMismatch) {
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  const uint32_t last = nodes() - 1;
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    Proposal p = allreduce("w", 5);
    p.signature.on_device = n == last;
    net.node(n).propose(std::move(p));
  }
  net.deliver_all();
  auto decisions = net.take_decisions();
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    ASSERT_EQ(decisions[n].size(), 1u);
    EXPECT_NE(decisions[n][0].error.find("node " + std::to_string(last) +
                                         " has allreduce, count 5, float32, sum, on device memory"),
              std::string::npos)
        << decisions[n][0].error;
  }
  // Every node on device memory agrees, and the name is cached as such.
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    Proposal p = allreduce("w", 5);
    p.signature.on_device = true;
    net.node(n).propose(std::move(p));
  }
  net.deliver_all();
  decisions = net.take_decisions();
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    ASSERT_EQ(decisions[n].size(), 1u);
    EXPECT_EQ(decisions[n][0].error, "");
  }
  const auto cached = net.node(0).cache().find("w");
  ASSERT_TRUE(cached.has_value());
  EXPECT_TRUE(cached->signature.on_device);
}

TEST_P(NegotiatorTest, ASmallCacheEvictsAndStaysConsistent) {
  std::mt19937_64 random(uint64_t{nodes()} * 7);
  Network net(nodes(), 3, nodes(), hold(), {}, route());
  const auto names = tensor_names(10);
  for (int step = 0; step < 6; ++step) EXPECT_EQ(run_step(net, names, random).size(), names.size());
  EXPECT_LE(net.node(0).cache().size(), 3u);
  for (uint32_t n = 1; n < net.nodes(); ++n) {
    for (uint32_t bit = 0; bit < 3; ++bit) {
      const std::string* a = net.node(0).cache().key_of(bit);
      const std::string* b = net.node(n).cache().key_of(bit);
      ASSERT_EQ(a == nullptr, b == nullptr);
      if (a != nullptr) {
        EXPECT_EQ(*a, *b);
      }
    }
  }
}

TEST_P(NegotiatorTest, WithoutACacheEveryCollectiveIsReportedByName) {
  std::mt19937_64 random(nodes());
  Network net(nodes(), 0, nodes(), hold(), {}, route());
  const auto names = tensor_names(12);
  for (int step = 0; step < 3; ++step) EXPECT_EQ(run_step(net, names, random).size(), names.size());
  EXPECT_EQ(net.node(0).counters().cache_hits, 0u);
  EXPECT_EQ(net.node(0).counters().cache_misses, 3u * names.size());
}

TEST_P(NegotiatorTest, ANodeAStepAheadHasItsInstancesDecidedInOrder) {
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  // Node 0 proposes the same name for two steps before the others have the first.
  net.node(0).propose(allreduce("a", 1));
  net.node(0).propose(allreduce("a", 1));
  net.deliver_all();
  for (uint32_t n = 1; n < net.nodes(); ++n) net.node(n).propose(allreduce("a", 1));
  net.deliver_all();
  auto first = net.take_decisions();
  for (const auto& d : first) EXPECT_EQ(keys(d), std::vector<std::string>{"a"});
  for (uint32_t n = 1; n < net.nodes(); ++n) net.node(n).propose(allreduce("a", 1));
  net.deliver_all();
  auto second = net.take_decisions();
  for (const auto& d : second) EXPECT_EQ(keys(d), std::vector<std::string>{"a"});
}

// Every node proposes each of `names` as `make(node, name)` has it; once every message is
// delivered, `check(node, contributions, name)` sees each decision, and every node must have
// decided every name.
template <typename Make, typename Check>
void expect_contributions(Network& net, const std::vector<std::string>& names, Make make,
                          Check check) {
  for (const auto& name : names) {
    for (uint32_t n = 0; n < net.nodes(); ++n) net.node(n).propose(make(n, name));
  }
  net.deliver_all();
  const auto cycles = net.take_cycles();
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    size_t decided = 0;
    for (const CycleDecisions& cycle : cycles[n]) {
      for (const Decision& d : cycle.decisions) {
        ++decided;
        check(n, cycle.contributions_of(d), net.node(n).name(d.name));
      }
    }
    EXPECT_EQ(decided, names.size()) << "node " << n;
  }
}

using Contributions = std::span<const std::span<const uint8_t>>;

std::vector<uint8_t> bytes_of(std::span<const uint8_t> contribution) {
  return {contribution.begin(), contribution.end()};
}

// With the reports of names new to the cache, and then with the cached names' bits.
TEST_P(NegotiatorTest, SmallContributionsRideAlongInNodeOrderAligned) {
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  const auto names = tensor_names(6);
  auto make = [](uint32_t n, const std::string& name) {
    Proposal p = allreduce(name, 100);
    p.piggybacks = true;
    p.eager.assign(3, static_cast<uint8_t>(n + 1));  // this node's part: its number, +1
    return p;
  };
  for (const bool cached : {false, true}) {
    SCOPED_TRACE(cached ? "cached" : "new");
    expect_contributions(
        net, names, make, [&](uint32_t, Contributions contributions, const std::string& name) {
          ASSERT_EQ(contributions.size(), net.nodes()) << name;
          for (uint32_t from = 0; from < net.nodes(); ++from) {
            EXPECT_EQ(bytes_of(contributions[from]),
                      std::vector<uint8_t>(3, static_cast<uint8_t>(from + 1)));
            // Kernels read each as an array of its dtype: 3-byte parts must not
            // misalign the next.
            EXPECT_EQ(reinterpret_cast<uintptr_t>(contributions[from].data()) % alignof(double),
                      0u);
          }
        });
    EXPECT_EQ(net.node(0).counters().cache_hits, cached ? names.size() : 0U);
  }
}

// A broadcast's way: node 0 sends its data, every other node an empty contribution, and the
// decision still comes with every node's. Where one node sends none, none piggyback.
// New names and cached ones alike.
TEST_P(NegotiatorTest, EmptyContributionsRideAlongAndOneNodeWithoutDataStopsTheRide) {
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  for (const uint32_t without : {nodes(), nodes() - 1}) {  // nodes(): every node piggybacks
    std::vector<std::string> names;
    names.reserve(4);
    for (int i = 0; i < 4; ++i) names.push_back(std::to_string(without) + "." + std::to_string(i));
    auto make = [without](uint32_t n, const std::string& name) {
      Proposal p = allreduce(name, 100);
      p.piggybacks = n != without;
      if (n == 0) p.eager.assign(5, 7);
      return p;
    };
    for (const bool cached : {false, true}) {
      SCOPED_TRACE(testing::Message() << "without " << without << (cached ? ", cached" : ", new"));
      expect_contributions(net, names, make,
                           [&](uint32_t, Contributions contributions, const std::string& name) {
                             if (without < nodes()) {
                               EXPECT_TRUE(contributions.empty()) << name;
                               return;
                             }
                             ASSERT_EQ(contributions.size(), net.nodes()) << name;
                             EXPECT_EQ(bytes_of(contributions[0]), std::vector<uint8_t>(5, 7));
                             for (uint32_t from = 1; from < net.nodes(); ++from)
                               EXPECT_TRUE(contributions[from].empty()) << from;
                           });
    }
  }
}

// The client's names for unnamed collectives are used once: they are decided, data and all, but
// never take a place in the cache.
TEST_P(NegotiatorTest, NamesOfUnnamedCollectivesAreNeverCached) {
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  std::vector<std::string> names;
  names.reserve(6);
  for (int i = 0; i < 5; ++i) names.push_back(ipc::kUnnamedPrefix + std::to_string(i));
  names.emplace_back("named");
  auto make = [](uint32_t n, const std::string& name) {
    Proposal p = allreduce(name, 1);
    p.piggybacks = true;
    p.eager.assign(4, static_cast<uint8_t>(n));
    return p;
  };
  expect_contributions(net, names, make,
                       [&](uint32_t, Contributions contributions, const std::string& name) {
                         EXPECT_EQ(contributions.size(), net.nodes()) << name;
                       });
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    EXPECT_EQ(net.node(n).cache().size(), 1U);
    EXPECT_TRUE(net.node(n).cache().find("named"));
  }
}

// Every node proposes `order`, each proposal with a cookie naming the step, the node and the
// name's place in `order`; every decision must hand back its own node's cookie for that name.
void expect_own_cookies(Network& net, const std::vector<std::string>& order, uint64_t step) {
  auto cookie = [step](uint32_t node, size_t i) { return 1000 * step + 100 * uint64_t{node} + i; };
  std::map<std::string, size_t> position;
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    for (size_t i = 0; i < order.size(); ++i) {
      Proposal p = allreduce(order[i], 10);
      p.cookie = cookie(n, i);
      net.node(n).propose(std::move(p));
    }
  }
  net.deliver_all();
  const auto decisions = net.take_decisions();
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    ASSERT_EQ(decisions[n].size(), order.size()) << "step " << step;
    for (const Decided& d : decisions[n]) {
      ASSERT_EQ(position.count(d.key), 1u) << d.key << " was not proposed in step " << step;
      EXPECT_EQ(d.cookie, cookie(n, position[d.key]))
          << d.key << " on node " << n << " in step " << step;
    }
  }
}

TEST_P(NegotiatorTest, DecisionsHandBackEachNodesOwnCookie) {
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  const auto names = tensor_names(5);
  // Step 0 goes by reports, step 1 through the cache.
  for (uint64_t step = 0; step < 2; ++step) expect_own_cookies(net, names, step);
}

// Names are found by guessing the one proposed after the last one in the step before
// (Negotiator::intern): the guess must never stand in for another name, whether steps keep
// their order, reverse it, or bring a name not seen before.
TEST_P(NegotiatorTest, NamesKeepTheirProposalsWhateverTheOrderOfTheSteps) {
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  const auto names = tensor_names(8);
  std::vector<std::vector<std::string>> orders(3, names);
  std::reverse(orders[1].begin(), orders[1].end());
  std::rotate(orders[2].begin(), orders[2].begin() + 3, orders[2].end());
  orders[2][4] = "grad.new";
  const std::vector<size_t> order_of_step = {0, 0, 0, 1, 0, 2, 2, 0};
  for (uint64_t step = 0; step < order_of_step.size(); ++step) {
    expect_own_cookies(net, orders[order_of_step[step]], step);
  }
}

// Node 0's tuned settings (autotune.h) reach every node with the cycle they were announced in,
// so every node applies them to the same decisions; the other nodes' are not announced.
TEST_P(NegotiatorTest, NodeZerosTunedSettingsComeWithItsCycleToEveryNode) {
  std::mt19937_64 random(nodes());
  Network net(nodes(), 1024, nodes(), hold(), {}, route());
  const auto names = tensor_names(4);
  run_step(net, names, random);
  for (const auto& cycles : net.take_cycles()) {
    for (const auto& cycle : cycles) EXPECT_FALSE(cycle.tuned);
  }
  const TuningAnnouncement announced{{1 << 20, 256 << 10, 25, 4 << 20}, false};
  net.node(0).announce(announced);
  // Another node announcing is not node 0's word: ignored.
  net.node(nodes() - 1).announce({{64 << 10, 64 << 10, 0, 0}, true});
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    for (const auto& name : names) net.node(n).propose(allreduce(name, 100));
  }
  net.deliver_all();
  const auto cycles = net.take_cycles();
  for (uint32_t n = 0; n < net.nodes(); ++n) {
    ASSERT_FALSE(cycles[n].empty()) << "node " << n;
    for (const auto& cycle : cycles[n]) {
      ASSERT_TRUE(cycle.tuned) << "node " << n << ", cycle " << cycle.cycle;
      EXPECT_EQ(*cycle.tuned, announced) << "node " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, NegotiatorTest,
                         ::testing::Combine(::testing::Values(2u, 3u, 5u, 8u), ::testing::Bool(),
                                            ::testing::Values(CycleRoute::kDirect,
                                                              CycleRoute::kRelayed)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "nodes" +
                                  (std::get<1>(info.param) ? "HoldingJoins" : "") +
                                  (std::get<2>(info.param) == CycleRoute::kRelayed ? "Relayed"
                                                                                   : "");
                         });

// One cycle's messages per node: n-1 sent straight to every node; relayed, one per hop of
// recursive doubling among the p = bit_floor(n) first nodes, two more for each of those that
// takes the part of a node past them (it tells that node of the cycle, and sends it the rest),
// one for each such node. A name new to the cache costs the same as a cached one: every node
// rules on the reports itself, with no answer to wait for.
TEST(Negotiator, RelayedCyclesCostEachNodeAMessageAHop) {
  for (const uint32_t nodes : {2u, 3u, 4u, 6u, 8u, 13u, 16u}) {
    for (const CycleRoute route : {CycleRoute::kDirect, CycleRoute::kRelayed}) {
      Network net(nodes, 1024, nodes, false, {}, route);
      for (const bool cached : {false, true}) {
        std::vector<uint64_t> before(nodes);
        for (uint32_t n = 0; n < nodes; ++n) before[n] = net.cycle_messages_sent(n);
        const uint64_t cycles = net.node(0).counters().cycles;
        // Every node proposes before any message moves: one cycle decides it.
        for (uint32_t n = 0; n < nodes; ++n) net.node(n).propose(allreduce("w", 2));
        net.deliver_all();
        const auto decided = net.take_decisions();
        const uint32_t p = std::bit_floor(nodes);
        const auto hops = static_cast<uint64_t>(std::countr_zero(p));
        for (uint32_t n = 0; n < nodes; ++n) {
          SCOPED_TRACE(testing::Message() << nodes << " nodes, node " << n << ", "
                                          << (route == CycleRoute::kRelayed ? "relayed" : "direct")
                                          << (cached ? ", cached" : ", new"));
          EXPECT_EQ(keys(decided[n]), std::vector<std::string>{"w"});
          EXPECT_EQ(net.node(n).counters().cycles - cycles, 1U);
          uint64_t expected = nodes - 1;
          if (route == CycleRoute::kRelayed) {
            expected = n >= p ? 1 : hops + (n + p < nodes ? 2 : 0);
          }
          EXPECT_EQ(net.cycle_messages_sent(n) - before[n], expected);
          EXPECT_EQ(net.node(n).counters().cycle_messages, net.cycle_messages_sent(n));
          EXPECT_EQ(net.node(n).counters().cache_hits, cached ? 1U : 0U);
        }
      }
    }
  }
}

// A new name reported by the nodes in different cycles is decided in the cycle of the last
// report, by every node alike; a node's stall attribution names the nodes with no report yet.
TEST(Negotiator, ReportsFromDifferentCyclesAreDecidedWithTheLastOne) {
  for (const uint32_t nodes : {2u, 3u, 5u}) {
    for (const CycleRoute route : {CycleRoute::kDirect, CycleRoute::kRelayed}) {
      SCOPED_TRACE(testing::Message() << nodes << " nodes, "
                                      << (route == CycleRoute::kRelayed ? "relayed" : "direct"));
      Network net(nodes, 1024, nodes, false, {}, route);
      for (uint32_t n = 0; n + 1 < nodes; ++n) net.node(n).propose(allreduce("w", 2));
      net.deliver_all();
      for (const auto& decided : net.take_decisions()) EXPECT_TRUE(decided.empty());
      for (uint32_t n = 0; n < nodes; ++n) {
        const std::vector<uint32_t> last{nodes - 1};
        EXPECT_EQ(net.node(n).nodes_without("w"), n == nodes - 1 ? std::vector<uint32_t>{} : last);
      }
      net.node(nodes - 1).propose(allreduce("w", 2));
      net.deliver_all();
      const auto cycles = net.take_cycles();
      for (uint32_t n = 0; n < nodes; ++n) {
        ASSERT_EQ(cycles[n].size(), 1U);
        EXPECT_EQ(cycles[n][0].cycle, cycles[0][0].cycle);
        ASSERT_EQ(cycles[n][0].decisions.size(), 1U);
        EXPECT_EQ(net.node(n).name(cycles[n][0].decisions[0].name), "w");
        EXPECT_EQ(cycles[n][0].decisions[0].error, "");
      }
    }
  }
}

// Relayed cycles under many interleavings, on node counts with nodes past p (which hear of a
// cycle from one node only), with a cache small enough to evict: every step's names are
// decided within the step, alike on every node.
TEST(Negotiator, RelayedCyclesDecideEveryStepUnderAnyDelivery) {
  for (const uint32_t nodes : {3u, 6u, 7u}) {
    for (uint64_t seed = 0; seed < 40; ++seed) {
      for (const bool hold : {false, true}) {
        SCOPED_TRACE(testing::Message() << nodes << " nodes, seed " << seed << ", hold " << hold);
        std::mt19937_64 random(seed);
        Network net(nodes, 3, seed, hold, {}, CycleRoute::kRelayed);
        const auto names = tensor_names(6);
        for (int step = 0; step < 4; ++step) {
          ASSERT_EQ(run_step(net, names, random).size(), names.size()) << "step " << step;
        }
      }
    }
  }
}

// A relayed message carries up to n-1 nodes' parts, each with its share of what one part sent
// directly may hold: 600 new names on 9 nodes (a part reports 256 a cycle), then 600
// contributions of 4 KiB each (32 KiB a part), all decided, and no message past a direct
// part's bounds.
TEST(Negotiator, RelayedMessagesHoldNoMoreThanAPartSentDirectly) {
  const uint32_t nodes = 9;
  Network net(nodes, 1024, 1, false, {}, CycleRoute::kRelayed);
  const auto names = tensor_names(600);
  for (const bool with_data : {false, true}) {
    // Every name ready on every node before any message moves.
    for (uint32_t n = 0; n < nodes; ++n) {
      for (size_t i = 0; i < names.size(); ++i) {
        Proposal p = allreduce(names[i], 100);
        p.piggybacks = with_data;
        if (with_data) p.eager.assign(4096, static_cast<uint8_t>(n));
        net.node(n).propose(std::move(p), i + 1 < names.size());
      }
    }
    net.deliver_all();
    const auto decided = net.take_decisions();
    for (uint32_t n = 0; n < nodes; ++n) EXPECT_EQ(decided[n].size(), names.size()) << n;
  }
  EXPECT_GT(net.most_reports(), kMaxUncachedPerCycle / 2);
  EXPECT_LE(net.most_reports(), kMaxUncachedPerCycle);
  EXPECT_GT(net.most_eager_bytes(), kEagerMaxTotalBytes / 2);
  EXPECT_LE(net.most_eager_bytes(), kEagerMaxTotalBytes);
}

// A relayed part claims a node of the job other than the receiver.
TEST(Negotiator, RejectsRelayedPartsOfNoOtherNode) {
  auto ignore = [](uint32_t, capnp::MessageBuilder&) {};
  Negotiator node1("job", 4, 1, "ranks 1", 16, {}, ignore, false, CycleRoute::kRelayed);
  for (const uint32_t origin : {1u, 4u}) {
    capnp::MallocMessageBuilder message;
    auto parts = message.initRoot<wire::NodeMessage>().initRelay(1);
    parts[0].setOrigin(origin);
    parts[0].initCycle().setNumber(1);
    EXPECT_THROW(node1.on_relay(0, parts.asReader()), std::invalid_argument) << origin;
  }
}

// A relayed part comes only through the node the route brings it by. What each node sends,
// from the sender's side: a node n past p hands its own part to n - p; each node n of the p
// first gives n + p every part but its own, and on hop h sends n ^ 2^h its block of 2^h nodes
// (those nodes' parts, and those of the nodes past p that handed theirs in to one of them).
// Every other (sender, origin) is refused.
TEST(Negotiator, RejectsRelayedPartsFromANodeTheRouteDoesNotBringThemThrough) {
  auto ignore = [](uint32_t, capnp::MessageBuilder&) {};
  for (const uint32_t nodes : {2u, 3u, 5u, 6u, 8u, 13u}) {
    const uint32_t p = std::bit_floor(nodes);
    std::set<std::tuple<uint32_t, uint32_t, uint32_t>> sent;  // sender, receiver, origin
    for (uint32_t n = p; n < nodes; ++n) sent.emplace(n, n - p, n);
    for (uint32_t n = 0; n < p; ++n) {
      for (uint32_t origin = 0; origin < nodes; ++origin) {
        if (n + p < nodes && origin != n + p) sent.emplace(n, n + p, origin);
        const uint32_t slot = origin < p ? origin : origin - p;
        for (uint32_t block = 1; block < p; block <<= 1) {
          if (slot / block == n / block) sent.emplace(n, n ^ block, origin);
        }
      }
    }
    for (uint32_t receiver = 0; receiver < nodes; ++receiver) {
      for (uint32_t sender = 0; sender < nodes; ++sender) {
        for (uint32_t origin = 0; origin < nodes; ++origin) {
          if (sender == receiver || origin == receiver) continue;
          SCOPED_TRACE(testing::Message() << nodes << " nodes: node " << sender << " to node "
                                          << receiver << ", node " << origin << "'s part");
          Negotiator node("job", nodes, receiver, "ranks", 16, {}, ignore, false,
                          CycleRoute::kRelayed);
          capnp::MallocMessageBuilder message;
          auto parts = message.initRoot<wire::NodeMessage>().initRelay(1);
          parts[0].setOrigin(origin);
          parts[0].initCycle().setNumber(1);
          if (sent.contains({sender, receiver, origin})) {
            EXPECT_NO_THROW(node.on_relay(sender, parts.asReader()));
          } else {
            EXPECT_THROW(node.on_relay(sender, parts.asReader()), std::invalid_argument);
          }
        }
      }
    }
  }
}

// A part that comes by the other route than the job's: from a peer that took that route, and
// the same part would come twice.
TEST(Negotiator, RejectsPartsByTheOtherRoute) {
  auto ignore = [](uint32_t, capnp::MessageBuilder&) {};
  Negotiator relaying("job", 4, 1, "ranks 1", 16, {}, ignore, false, CycleRoute::kRelayed);
  Negotiator direct("job", 4, 1, "ranks 1", 16, {}, ignore, false, CycleRoute::kDirect);
  capnp::MallocMessageBuilder sent;
  sent.initRoot<wire::NodeMessage>().initCycle().setNumber(1);
  capnp::MallocMessageBuilder relayed;
  auto parts = relayed.initRoot<wire::NodeMessage>().initRelay(1);
  parts[0].setOrigin(0);
  parts[0].initCycle().setNumber(1);
  const auto sent_part = sent.getRoot<wire::NodeMessage>().asReader().getCycle();
  EXPECT_THROW(relaying.on_cycle(0, sent_part), std::invalid_argument);
  EXPECT_THROW(direct.on_relay(0, parts.asReader()), std::invalid_argument);
  // Each takes its own route's part.
  EXPECT_NO_THROW(relaying.on_relay(0, parts.asReader()));
  EXPECT_NO_THROW(direct.on_cycle(0, sent_part));
}

// Node 0's rank is a step ahead: its cycle reaches node 1 before node 1's rank submits.
// Joining at once, node 1 makes that cycle decide nothing and the collective needs a second;
// holding, node 1 joins with the collective and one cycle decides it.
// What piggybacks follows the agreed figures, not a node's own. Before a cycle has told the
// nodes each other's figures, each takes the least limit, so that all decide alike; then, where
// node 0 reduces slowly (large γ), piggybacking pays only for small tensors, and node 1, which
// alone would let 32 KiB piggyback, takes node 0's limit; where both are fast, both take 32 KiB.
TEST(Negotiator, TheEagerLimitFollowsTheAgreedFigures) {
  for (const double node0_gamma : {1e-8, 1e-10}) {
    SCOPED_TRACE(node0_gamma);
    Network net(2, 1024, 1, false, [node0_gamma](uint32_t n) {
      return cost_model::LinkFigures{1e-5, 1e-9, n == 0 ? node0_gamma : 1e-10};
    });
    for (uint32_t n = 0; n < 2; ++n) {
      ASSERT_EQ(net.node(n).agreed_eager_max_bytes(), cost_model::kEagerMinBytes) << "node " << n;
    }
    std::mt19937_64 random(1);
    run_step(net, tensor_names(3), random);
    const uint64_t agreed =
        node0_gamma > 1e-10 ? cost_model::kEagerMinBytes : cost_model::kEagerCapBytes;
    for (uint32_t n = 0; n < 2; ++n) {
      EXPECT_EQ(net.node(n).agreed_eager_max_bytes(), agreed) << "node " << n;
    }
  }
}

TEST(Negotiator, ANodeWithNothingToProposeHoldsItsPartOfAPeersCycle) {
  for (const bool hold : {false, true}) {
    Network net(2, 16, 1, hold);
    for (uint32_t n = 0; n < 2; ++n) net.node(n).propose(allreduce("x", 100));
    net.deliver_all();  // by reports: "x" is cached now
    ASSERT_EQ(net.take_decisions()[1].size(), 1U);
    const uint64_t cycles = net.node(1).counters().cycles;

    net.node(0).propose(allreduce("x", 100));
    net.deliver_one(0, 1);  // node 0's cycle, and nothing released
    EXPECT_EQ(net.node(1).holding(), hold);
    net.node(1).propose(allreduce("x", 100));
    net.deliver_all();
    const auto decided = net.take_decisions();
    EXPECT_EQ(keys(decided[0]), std::vector<std::string>{"x"});
    EXPECT_EQ(keys(decided[1]), std::vector<std::string>{"x"});
    EXPECT_EQ(net.node(1).counters().cycles - cycles, hold ? 1U : 2U) << "hold " << hold;
    EXPECT_FALSE(net.node(1).holding());
  }
}

// A hold ends when the daemon's wait for it does: the node joins with nothing, the cycle
// decides nothing, and the next collective negotiates as usual.
TEST(Negotiator, AReleasedHoldJoinsWithNothingAndTheNextCycleDecides) {
  Network net(2, 16, 1, true);
  for (uint32_t n = 0; n < 2; ++n) net.node(n).propose(allreduce("y", 100));
  net.deliver_all();
  net.take_decisions();
  net.node(0).propose(allreduce("y", 100));
  net.deliver_one(0, 1);
  ASSERT_TRUE(net.node(1).holding());
  net.node(1).release_hold();
  EXPECT_FALSE(net.node(1).holding());
  net.deliver_all();
  EXPECT_TRUE(net.take_decisions()[0].empty());
  net.node(1).propose(allreduce("y", 100));
  net.deliver_all();
  const auto decided = net.take_decisions();
  EXPECT_EQ(keys(decided[0]), std::vector<std::string>{"y"});
  EXPECT_EQ(keys(decided[1]), std::vector<std::string>{"y"});
}

Signature sized(uint64_t count) {
  return allreduce("", count).signature;
}

TEST(ResponseCache, ReusesTheLowestFreeBitAndEvictsTheLeastRecentlyUsed) {
  ResponseCache cache(3);
  EXPECT_EQ(cache.put("a", sized(1)), 0u);
  EXPECT_EQ(cache.put("b", sized(2)), 1u);
  EXPECT_EQ(cache.put("c", sized(3)), 2u);
  cache.touch(0);  // b is now the least recently used
  std::optional<std::string> evicted;
  EXPECT_EQ(cache.put("d", sized(4), &evicted), 1u);
  EXPECT_EQ(evicted, "b");
  EXPECT_FALSE(cache.find("b"));
  EXPECT_EQ(cache.find("d")->bit, 1u);
  cache.erase(2);
  EXPECT_EQ(cache.bit_span(), 2u);
  EXPECT_EQ(cache.put("e", sized(5)), 2u);
  EXPECT_EQ(cache.put("a", sized(6)), 0u);  // refresh keeps the bit, takes the new signature
  EXPECT_EQ(cache.find("a")->signature, sized(6));
}

TEST(ResponseCache, GenerationChangesWithTheMappingNotWithUse) {
  ResponseCache cache(4);
  const uint64_t empty = cache.generation();
  cache.put("a", sized(1));
  const uint64_t after_put = cache.generation();
  EXPECT_NE(after_put, empty);
  cache.touch(0);
  EXPECT_EQ(cache.generation(), after_put);  // use alone keeps remembered bits valid
  cache.put("a", sized(2));                  // a new signature: what was remembered is stale
  EXPECT_NE(cache.generation(), after_put);
  const uint64_t before_erase = cache.generation();
  cache.erase(0);
  EXPECT_NE(cache.generation(), before_erase);
}

TEST(ResponseCache, DisabledCacheRefusesEntries) {
  ResponseCache cache(0);
  EXPECT_THROW(cache.put("a", sized(1)), std::logic_error);
  EXPECT_FALSE(cache.find("a"));
}

TEST(Negotiator, RejectsMessagesNoCorrectPeerSends) {
  auto ignore = [](uint32_t, capnp::MessageBuilder&) {};
  Negotiator node0("job", 2, 0, "ranks 0", 16, {}, ignore);
  capnp::MallocMessageBuilder message;
  auto cycle = message.initRoot<wire::NodeMessage>().initCycle();
  cycle.setNumber(5);  // this node is at cycle 0
  EXPECT_THROW(node0.on_cycle(1, cycle.asReader()), std::invalid_argument);
  cycle.setNumber(1);
  node0.on_cycle(1, cycle.asReader());  // joined and completed at once
  EXPECT_THROW(node0.on_cycle(1, cycle.asReader()), std::invalid_argument);  // again
}

// The contributions piggybacking on a cycle: one blob, laid out as the sender's EagerSet lays it
// out. A layout that does not fit its blob, or out of bit order, is refused before any of it
// is read.
TEST(Negotiator, RejectsContributionsThatDoNotFitTheirData) {
  auto ignore = [](uint32_t, capnp::MessageBuilder&) {};
  struct Layout {
    std::vector<uint32_t> bits;
    std::vector<uint32_t> sizes;
    size_t data_bytes;
    bool valid;
  };
  const Layout layouts[] = {
      {{1, 2}, {4, 4}, 20, true},     // 4 bytes, padding to 16, 4 bytes
      {{1, 2}, {4, 4}, 19, false},    // the second ends past the data
      {{1, 2}, {4}, 20, false},       // a size missing
      {{2, 1}, {4, 4}, 20, false},    // out of order
      {{1}, {UINT32_MAX}, 8, false},  // a size beyond any data
      {{1, 2}, {20, 0}, 20, false},   // an empty one still starts at a multiple of 16
  };
  for (const Layout& layout : layouts) {
    Negotiator node0("job", 2, 0, "ranks 0", 16, {}, ignore);
    capnp::MallocMessageBuilder message;
    auto cycle = message.initRoot<wire::NodeMessage>().initCycle();
    cycle.setNumber(1);
    auto bits = cycle.initEagerBits(static_cast<unsigned>(layout.bits.size()));
    for (unsigned i = 0; i < bits.size(); ++i) bits.set(i, layout.bits[i]);
    auto sizes = cycle.initEagerSizes(static_cast<unsigned>(layout.sizes.size()));
    for (unsigned i = 0; i < sizes.size(); ++i) sizes.set(i, layout.sizes[i]);
    const std::vector<uint8_t> data(layout.data_bytes, 7);
    cycle.setEagerData(kj::arrayPtr(data.data(), data.size()));
    if (layout.valid) {
      EXPECT_NO_THROW(node0.on_cycle(1, cycle.asReader()));
    } else {
      EXPECT_THROW(node0.on_cycle(1, cycle.asReader()), std::invalid_argument)
          << layout.data_bytes << " bytes";
    }
  }
}

// Two inputs tests/fuzz found (both also in its corpus): a report with values outside the enums,
// and a short message listing more reports than any node sends in a cycle.
TEST(Negotiator, RejectsReportsNoRankCouldSubmitAndTooManyOfThem) {
  auto ignore = [](uint32_t, capnp::MessageBuilder&) {};
  // Values outside the enums, and an allreduce of float32 by a bitwise op.
  for (const auto& [collective, dtype, op] : std::vector<std::array<uint8_t, 3>>{
           {9, 0, 0}, {0, 248, 0}, {0, 0, 77}, {0, GRADSYNC_FLOAT32, GRADSYNC_BXOR}}) {
    Negotiator node0("job", 2, 0, "ranks 0", 16, {}, ignore);
    capnp::MallocMessageBuilder message;
    auto cycle = message.initRoot<wire::NodeMessage>().initCycle();
    cycle.setNumber(1);
    auto ready = cycle.initUncached(1)[0];
    ready.setKey("w");
    ready.setCollective(collective);
    ready.setDtype(dtype);
    ready.setOp(op);
    EXPECT_THROW(node0.on_cycle(1, cycle.asReader()), std::invalid_argument);
  }
  Negotiator node0("job", 2, 0, "ranks 0", 16, {}, ignore);
  capnp::MallocMessageBuilder message;
  auto cycle = message.initRoot<wire::NodeMessage>().initCycle();
  cycle.setNumber(1);
  cycle.initUncached(kMaxUncachedPerCycle + 1);
  EXPECT_THROW(node0.on_cycle(1, cycle.asReader()), std::invalid_argument);
  // Contributions with reports are kept until every node reports the same: no more than a node
  // sends in a cycle.
  const std::vector<uint8_t> data(kEagerMaxTotalBytes / 2 + 1, 3);
  auto reports = cycle.initUncached(2);
  for (auto report : reports) {
    report.setKey("w");
    report.setPiggybacks(true);
    report.setEager(kj::arrayPtr(data.data(), data.size()));
  }
  EXPECT_THROW(node0.on_cycle(1, cycle.asReader()), std::invalid_argument);
  reports[1].setEager(kj::arrayPtr(data.data(), 1));
  EXPECT_NO_THROW(node0.on_cycle(1, cycle.asReader()));
}

}  // namespace
}  // namespace gradsync::daemon
