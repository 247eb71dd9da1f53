// What the control thread admits of a hello and of a registered range: the edges a fuzzer is
// unlikely to hit by chance.
#include "daemon/control/admission.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <memory>

namespace gradsync::daemon {
namespace {

struct Hello {
  capnp::MallocMessageBuilder message;
  ipc::wire::Hello::Builder hello = message.initRoot<ipc::wire::Hello>();
  Hello(int32_t rank, int32_t world, int32_t local, int32_t local_world) {
    hello.setProtocolVersion(ipc::kProtocolVersion);
    hello.setJob("train");
    hello.setRank(rank);
    hello.setWorldSize(world);
    hello.setLocalRank(local);
    hello.setLocalWorldSize(local_world);
    hello.setNodeRank(-1);
  }
  void nodes(std::initializer_list<const char*> addresses) {
    auto list = hello.initNodes(static_cast<unsigned>(addresses.size()));
    unsigned i = 0;
    for (const char* a : addresses) list.set(i++, a);
  }
  ClientIdentity admit(const HelloRules& rules = {"10.0.0.1:9478", "auto", "none"}) {
    return validate_hello(hello.asReader(), 42, 1000, rules);
  }
};

// The refusal's message, or "" when admitted.
template <typename Fn>
std::string refusal(Fn&& fn) {
  try {
    fn();
  } catch (const Refusal& r) {
    return r.message;
  }
  return "";
}

TEST(Admission, AHelloOfOneNodeIsAdmitted) {
  Hello h(1, 2, 1, 2);
  const ClientIdentity who = h.admit();
  EXPECT_EQ(who.job, "train");
  EXPECT_EQ(who.local_rank, 1);
  EXPECT_EQ(who.pid, 42);
  EXPECT_EQ(who.uid, 1000u);
  EXPECT_TRUE(who.nodes.empty());
}

TEST(Admission, RanksOutOfRangeAreRefused) {
  for (auto [rank, world, local, local_world] :
       std::vector<std::array<int32_t, 4>>{{-1, 2, 0, 2},
                                           {2, 2, 0, 2},
                                           {0, 2, 2, 2},
                                           {0, 2, -5, 2},
                                           {0, 1, 0, 2},
                                           {0, 1000, 0, ipc::kMaxLocalRanks + 1},
                                           {0, 0, 0, 0}}) {
    Hello h(rank, world, local, local_world);
    EXPECT_NE(refusal([&] { h.admit(); }).find("inconsistent identity"), std::string::npos)
        << rank << " " << world << " " << local << " " << local_world;
  }
}

TEST(Admission, BadJobNamesAndVersionsAreRefused) {
  for (const char* name : {"", "a b", "../x", "job\n"}) {
    Hello h(0, 1, 0, 1);
    h.hello.setJob(name);
    EXPECT_NE(refusal([&] { h.admit(); }).find("job name"), std::string::npos) << name;
  }
  Hello h(0, 1, 0, 1);
  h.hello.setJob(std::string(ipc::kMaxJobNameBytes + 1, 'j'));
  EXPECT_NE(refusal([&] { h.admit(); }), "");
  Hello old(0, 1, 0, 1);
  old.hello.setProtocolVersion(ipc::kProtocolVersion + 1);
  EXPECT_NE(refusal([&] { old.admit(); }).find("protocol version"), std::string::npos);
}

TEST(Admission, NodesAreCheckedAgainstThisDaemon) {
  Hello spans(0, 2, 0, 1);  // two ranks, one local, no node list
  EXPECT_NE(refusal([&] { spans.admit(); }).find("needs GRADSYNC_NODES"), std::string::npos);

  Hello found(1, 2, 0, 1);
  found.nodes({"10.0.0.2:9478", "10.0.0.1:9478"});
  EXPECT_EQ(found.admit().node_rank, 1u);  // found by its own address

  Hello absent(1, 2, 0, 1);
  absent.nodes({"10.0.0.2:9478", "10.0.0.3:9478"});
  EXPECT_NE(refusal([&] { absent.admit(); }).find("not in GRADSYNC_NODES"), std::string::npos);

  Hello beyond(1, 2, 0, 1);
  beyond.nodes({"10.0.0.2:9478", "10.0.0.1:9478"});
  beyond.hello.setNodeRank(2);
  EXPECT_NE(refusal([&] { beyond.admit(); }).find("node rank 2 outside"), std::string::npos);

  Hello no_listener(1, 2, 0, 1);
  no_listener.nodes({"10.0.0.2:9478", "10.0.0.1:9478"});
  EXPECT_NE(refusal([&] {
              no_listener.admit({"", "auto", "none"});
            }).find("no inter-node listener"),
            std::string::npos);

  Hello algorithm(1, 2, 0, 1);
  algorithm.nodes({"10.0.0.2:9478", "10.0.0.1:9478"});
  algorithm.hello.setAlgorithm("tree");
  EXPECT_NE(refusal([&] { algorithm.admit(); }).find("GRADSYNC_ALGO"), std::string::npos);

  Hello codec(1, 2, 0, 1);
  codec.nodes({"10.0.0.2:9478", "10.0.0.1:9478"});
  codec.hello.setWireCodec("fp8");
  EXPECT_NE(refusal([&] {
              codec.admit();
            }).find("GRADSYNC_WIRE_CODEC must be none, bf16, topk or topk:PERCENT"),
            std::string::npos);
  codec.hello.setWireCodec("topk:200");
  EXPECT_NE(refusal([&] { codec.admit(); }).find("not 'topk:200'"), std::string::npos);
  // Unset: the daemon's default; set: the job's own.
  Hello fallback(1, 2, 0, 1);
  fallback.nodes({"10.0.0.2:9478", "10.0.0.1:9478"});
  EXPECT_EQ(fallback.admit({"10.0.0.1:9478", "auto", "bf16"}).wire_codec, "bf16");
  fallback.hello.setWireCodec("none");
  EXPECT_EQ(fallback.admit({"10.0.0.1:9478", "auto", "bf16"}).wire_codec, "none");
}

TEST(Admission, APartNamesAnotherJobAndADistinctRankInItForEachOfItsRanks) {
  auto part = [](const char* parent, const std::vector<int32_t>& ranks) {
    auto h = std::make_unique<Hello>(0, 2, 0, 2);
    h->hello.setParentJob(parent);
    auto list = h->hello.initParentRanks(static_cast<unsigned>(ranks.size()));
    unsigned i = 0;
    for (const int32_t rank : ranks) list.set(i++, rank);
    return h;
  };
  const ClientIdentity who = part("world", {3, 1})->admit();
  EXPECT_EQ(who.parent_job, "world");
  EXPECT_EQ(who.parent_ranks, (std::vector<int32_t>{3, 1}));
  EXPECT_TRUE(Hello(0, 2, 0, 2).admit().parent_job.empty());

  struct Refused {
    const char* parent;
    std::vector<int32_t> ranks;
    const char* said;
  };
  for (const Refused& bad : std::vector<Refused>{{"world", {3}, "names 1 ranks"},
                                                 {"world", {3, 1, 2}, "names 3 ranks"},
                                                 {"world", {1, 1}, "distinct"},
                                                 {"world", {-1, 1}, "not negative"},
                                                 {"train", {0, 1}, "another job's name"},
                                                 {"a b", {0, 1}, "another job's name"},
                                                 {"", {0, 1}, "without a parent job"}}) {
    EXPECT_NE(refusal([&] { part(bad.parent, bad.ranks)->admit(); }).find(bad.said),
              std::string::npos)
        << bad.parent << " " << bad.ranks.size();
  }
}

TEST(Admission, RangesMustLieInsideTheirMemory) {
  EXPECT_EQ(refusal([] { validate_range(1, 0, 4096, 4096); }), "");
  EXPECT_EQ(refusal([] { validate_range(1, 4095, 1, 4096); }), "");  // the last byte
  EXPECT_NE(refusal([] { validate_range(1, 4096, 1, 4096); }), "");  // one past the end
  EXPECT_NE(refusal([] { validate_range(1, 0, 0, 4096); }), "");     // empty
  // offset + bytes wraps around: it must not look small.
  EXPECT_NE(refusal([] { validate_range(1, UINT64_MAX - 10, 20, 4096); }), "");
  // A "negative" size, as a malicious client would write it.
  EXPECT_NE(refusal([] { validate_range(1, 8, static_cast<uint64_t>(-8), 4096); }), "");
}

}  // namespace
}  // namespace gradsync::daemon
