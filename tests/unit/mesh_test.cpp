// Two UCX meshes in one process, over TCP on loopback: tagged messages both ways, small
// (eager) and large (rendezvous), and a peer that goes away.
#include "transport/mesh.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <numeric>
#include <vector>

namespace gradsync::transport {
namespace {

using Clock = std::chrono::steady_clock;

class MeshTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = std::make_unique<Mesh>(MeshOptions{"127.0.0.1:0"});
    b_ = std::make_unique<Mesh>(MeshOptions{"127.0.0.1:0"});
    a_to_b_ = a_->connect("127.0.0.1:" + std::to_string(b_->port()));
    b_to_a_ = b_->connect("127.0.0.1:" + std::to_string(a_->port()));
  }
  // Progresses both sides until every operation is done (or fails the test after 10 s).
  void drive(std::initializer_list<Operation*> operations) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    auto all_done = [&] {
      for (Operation* op : operations) {
        if (!op->done()) return false;
      }
      return true;
    };
    while (!all_done()) {
      if (a_) a_->progress();
      if (b_) b_->progress();
      ASSERT_LT(Clock::now(), deadline) << "operations did not complete";
    }
  }
  std::unique_ptr<Mesh> a_, b_;
  PeerId a_to_b_ = 0, b_to_a_ = 0;
};

TEST_F(MeshTest, ListensOnAnEphemeralPort) {
  EXPECT_NE(a_->port(), 0);
  EXPECT_NE(a_->port(), b_->port());
}

TEST_F(MeshTest, SmallTaggedMessagesBothWays) {
  uint64_t ping = 0x1234, pong = 0x5678, got_ping = 0, got_pong = 0;
  Operation receive_ping = b_->receive(7, ~uint64_t{0}, &got_ping, sizeof(got_ping));
  Operation receive_pong = a_->receive(8, ~uint64_t{0}, &got_pong, sizeof(got_pong));
  Operation send_ping = a_->send(a_to_b_, 7, &ping, sizeof(ping));
  Operation send_pong = b_->send(b_to_a_, 8, &pong, sizeof(pong));
  drive({&receive_ping, &receive_pong, &send_ping, &send_pong});
  EXPECT_EQ(receive_ping.status(), UCS_OK);
  EXPECT_EQ(got_ping, ping);
  EXPECT_EQ(got_pong, pong);
  EXPECT_EQ(receive_ping.received_bytes(), sizeof(ping));
}

TEST_F(MeshTest, LargeMessageLandsInTheReceiveBuffer) {
  std::vector<float> source(2 << 20);  // 8 MiB: rendezvous
  std::iota(source.begin(), source.end(), 1.0f);
  std::vector<float> target(source.size(), 0.0f);
  Operation send = a_->send(a_to_b_, 42, source.data(), source.size() * sizeof(float));
  // Posted after the send started: the message may arrive unexpected first.
  Operation receive = b_->receive(42, ~uint64_t{0}, target.data(), target.size() * sizeof(float));
  drive({&send, &receive});
  EXPECT_EQ(receive.status(), UCS_OK);
  EXPECT_EQ(target, source);
}

TEST_F(MeshTest, TagMaskSelectsBySender) {
  // High bits name the sender; a receive for "any tag from A" matches only A's message.
  uint32_t value = 99, got = 0;
  Operation receive = b_->receive(uint64_t{1} << 56, uint64_t{0xff} << 56, &got, sizeof(got));
  Operation send = a_->send(a_to_b_, (uint64_t{1} << 56) | 12345, &value, sizeof(value));
  drive({&send, &receive});
  EXPECT_EQ(got, 99u);
}

TEST_F(MeshTest, DeadPeerIsReportedWithinABound) {
  uint64_t warm = 1, got = 0;
  Operation receive = b_->receive(1, ~uint64_t{0}, &got, sizeof(got));
  Operation send = a_->send(a_to_b_, 1, &warm, sizeof(warm));
  drive({&send, &receive});
  b_.reset();  // the peer goes away
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::vector<PeerId> failed;
  while (failed.empty() && Clock::now() < deadline) {
    // Traffic toward the dead peer surfaces the failure.
    Operation probe = a_->send(a_to_b_, 2, &warm, sizeof(warm));
    for (int i = 0; i < 1000 && !probe.done(); ++i) a_->progress();
    failed = a_->take_failed_peers();
  }
  ASSERT_EQ(failed, std::vector<PeerId>{a_to_b_});
  EXPECT_TRUE(a_->failed(a_to_b_));
  Operation after = a_->send(a_to_b_, 3, &warm, sizeof(warm));
  EXPECT_TRUE(after.done());
  EXPECT_NE(after.status(), UCS_OK);
  EXPECT_TRUE(a_->take_failed_peers().empty()) << "a failure is reported once";
}

TEST(HostPort, ParsesAndRejects) {
  const auto address = parse_host_port("198.18.0.2:9478");
  EXPECT_EQ(ntohs(address.sin_port), 9478);
  EXPECT_THROW(parse_host_port("198.18.0.2"), std::invalid_argument);
  EXPECT_THROW(parse_host_port("host:1"), std::invalid_argument);
  EXPECT_THROW(parse_host_port("1.2.3.4:70000"), std::invalid_argument);
}

}  // namespace
}  // namespace gradsync::transport
