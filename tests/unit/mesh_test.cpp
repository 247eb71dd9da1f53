// Two UCX meshes in one process, over TCP on loopback: tagged messages both ways, small
// (eager) and large (rendezvous), a peer that goes away and comes back, and the cluster
// handshake (same key, another key, no key, a connection that never speaks).
#include "transport/mesh.h"
#include "transport/network_transports.h"
#include "transport/reachable_address.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

namespace gradsync::transport {
namespace {

using Clock = std::chrono::steady_clock;

// A client that speaks UCX without a mesh (no handshake, no goodbye): an endpoint to
// `address`, with `on_error` told of its failure.
ucp_ep_h connect_without_mesh(ucp_worker_h worker, const struct sockaddr_in& address,
                              ucp_err_handler_cb_t on_error, void* arg) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const struct sockaddr*>(&address);
  params.sockaddr.addrlen = sizeof(address);
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_error;
  params.err_handler.arg = arg;
  ucp_ep_h endpoint = nullptr;
  EXPECT_EQ(ucp_ep_create(worker, &params, &endpoint), UCS_OK);
  return endpoint;
}

// Closes it at once, as a process that goes.
void close_at_once(ucp_worker_h worker, ucp_ep_h endpoint) {
  ucp_request_param_t close{};
  close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(endpoint, &close);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(request);
  }
}

class MeshTest : public ::testing::Test {
 protected:
  virtual MeshOptions options() const { return MeshOptions{"127.0.0.1:0"}; }
  void SetUp() override {
    a_ = std::make_unique<Mesh>(options());
    b_ = std::make_unique<Mesh>(options());
    a_to_b_ = a_->connect("127.0.0.1:" + std::to_string(b_->port()));
    b_to_a_ = b_->connect("127.0.0.1:" + std::to_string(a_->port()));
    drive_until([&] { return a_->authenticated(a_to_b_) && b_->authenticated(b_to_a_); });
  }
  template <typename Done>
  void drive_until(Done done) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!done()) {
      if (a_) a_->progress();
      if (b_) b_->progress();
      ASSERT_LT(Clock::now(), deadline) << "the meshes did not get there in 10 s";
    }
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

// UCX moves CUDA memory only through its CUDA transport module, which loads from UCX's module
// folder (UCX_MODULE_DIR, else "ucx" beside libucp): without that module the mesh must not
// claim it. (With it, the answer depends on the driver as well.)
TEST_F(MeshTest, ClaimsCudaMemoryOnlyWithUcxsCudaModule) {
  Dl_info library{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&ucp_init_version), &library), 0);
  const char* configured = std::getenv("UCX_MODULE_DIR");
  const std::filesystem::path modules =
      configured != nullptr ? std::filesystem::path(configured)
                            : std::filesystem::path(library.dli_fname).parent_path() / "ucx";
  if (!std::filesystem::exists(modules / "libuct_cuda.so.0")) {
    EXPECT_FALSE(a_->moves_cuda_memory()) << "no libuct_cuda in " << modules;
  }
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

// The same meshes with bulk data sent eagerly (tcp_bulk_protocol = "eager").
class EagerMeshTest : public MeshTest {
 protected:
  MeshOptions options() const override {
    MeshOptions options{"127.0.0.1:0"};
    options.tcp_rendezvous_min_bytes = MeshOptions::kEveryMessageEager;
    return options;
  }
};

// 8 MiB, eager (TCP here) or after a rendezvous handshake. The receive is posted after the
// send started: the message may arrive unexpected first (eager: UCX holds it until then).
void expect_large_message_lands(
    Mesh& a, PeerId a_to_b, Mesh& b,
    const std::function<void(std::initializer_list<Operation*>)>& drive) {
  std::vector<float> source(2 << 20);
  std::iota(source.begin(), source.end(), 1.0f);
  std::vector<float> target(source.size(), 0.0f);
  Operation send = a.send(a_to_b, 42, source.data(), source.size() * sizeof(float));
  Operation receive = b.receive(42, ~uint64_t{0}, target.data(), target.size() * sizeof(float));
  drive({&send, &receive});
  EXPECT_EQ(receive.status(), UCS_OK);
  EXPECT_EQ(target, source);
}

TEST_F(EagerMeshTest, LargeMessageLandsInTheReceiveBuffer) {
  EXPECT_EQ(a_->rendezvous_min_bytes(), MeshOptions::kEveryMessageEager) << "UCX here has TCP only";
  expect_large_message_lands(*a_, a_to_b_, *b_, [this](auto ops) { drive(ops); });
}

TEST_F(MeshTest, LargeMessageLandsInTheReceiveBuffer) {
  EXPECT_EQ(a_->rendezvous_min_bytes(), 0U);
  expect_large_message_lands(*a_, a_to_b_, *b_, [this](auto ops) { drive(ops); });
}

// Control messages posted after bulk data that TCP has not carried yet arrive first, in order:
// they have a connection of their own, where on the bulk one they would wait for every byte
// handed over before them (64 MiB here).
TEST_F(EagerMeshTest, ControlMessagesOvertakeBulkDataHandedOverBeforeThem) {
  const std::vector<uint8_t> bulk(64 << 20, 7);
  std::vector<uint8_t> landed(bulk.size());
  Operation receive = b_->receive(1, ~uint64_t{0}, landed.data(), landed.size());
  Operation send = a_->send(a_to_b_, 1, bulk.data(), bulk.size());
  for (uint8_t i = 0; i < 3; ++i) {
    a_->post(a_to_b_, 2, std::make_shared<const std::vector<uint8_t>>(8, i), Lane::kControl);
  }
  std::vector<uint8_t> order;
  bool bulk_done_first = false;
  drive_until([&] {
    while (auto message = b_->poll_message(2, ~uint64_t{0})) {
      if (order.empty()) bulk_done_first = receive.done();
      order.push_back(message->payload[0]);
    }
    return order.size() == 3;
  });
  EXPECT_FALSE(bulk_done_first) << "the first control message waited for the bulk data";
  EXPECT_EQ(order, (std::vector<uint8_t>{0, 1, 2}));
  drive({&send, &receive});
  EXPECT_EQ(receive.status(), UCS_OK);
  EXPECT_EQ(landed, bulk);
}

// What the pacer learns the link from: a send the peer does not take yet is held, and the time
// the mesh held its backlog (4 MiB) or more counts as backlogged; once the peer takes it, it
// counts as delivered. A small send that goes at once adds no backlogged time.
TEST_F(EagerMeshTest, SendLoadCountsHeldDeliveredAndBackloggedSends) {
  const SendLoad before = a_->send_load(Clock::now());
  const std::vector<uint8_t> small(1024, 1);
  std::vector<uint8_t> small_landed(small.size());
  Operation small_receive = b_->receive(3, ~uint64_t{0}, small_landed.data(), small.size());
  Operation small_send = a_->send(a_to_b_, 3, small.data(), small.size());
  drive({&small_send, &small_receive});
  const SendLoad after_small = a_->send_load(Clock::now());
  EXPECT_EQ(after_small.delivered_bytes - before.delivered_bytes, small.size());
  EXPECT_EQ(after_small.held_bytes, 0u);
  EXPECT_EQ(after_small.backlogged_seconds, before.backlogged_seconds);

  // 64 MiB, more than the sockets between the two take, while only the sender moves.
  const std::vector<uint8_t> bulk(64 << 20, 7);
  std::vector<uint8_t> landed(bulk.size());
  const auto began = Clock::now();
  Operation send = a_->send(a_to_b_, 4, bulk.data(), bulk.size());
  for (const auto until = began + std::chrono::milliseconds(50); Clock::now() < until;) {
    a_->progress();
  }
  const SendLoad stuck = a_->send_load(Clock::now());
  EXPECT_FALSE(send.done());
  EXPECT_GE(stuck.held_bytes, MeshOptions{}.backlog_bytes);
  EXPECT_GT(stuck.backlogged_seconds, after_small.backlogged_seconds);
  Operation receive = b_->receive(4, ~uint64_t{0}, landed.data(), landed.size());
  drive({&send, &receive});
  const SendLoad done = a_->send_load(Clock::now());
  const double elapsed = std::chrono::duration<double>(Clock::now() - began).count();
  EXPECT_EQ(done.held_bytes, 0u);
  EXPECT_EQ(done.delivered_bytes - after_small.delivered_bytes, bulk.size());
  EXPECT_LE(done.backlogged_seconds - after_small.backlogged_seconds, elapsed);
  EXPECT_EQ(landed, bulk);
}

// The same meshes with the daemon's default rendezvous threshold (tcp_rendezvous_min_bytes),
// as where a job cuts its bulk data into eager messages on a slow link.
class ThresholdMeshTest : public MeshTest {
 protected:
  static constexpr uint64_t kThreshold = 256 << 10;
  MeshOptions options() const override {
    MeshOptions options{"127.0.0.1:0"};
    options.tcp_rendezvous_min_bytes = kThreshold;
    return options;
  }
  // Progresses both meshes for `duration`, or until `done`.
  template <typename Done>
  void drive_for(std::chrono::milliseconds duration, Done done) {
    const auto until = Clock::now() + duration;
    while (!done() && Clock::now() < until) {
      a_->progress();
      b_->progress();
    }
  }
};

TEST_F(ThresholdMeshTest, LargestEagerMessageIsBelowTheThreshold) {
  ASSERT_EQ(a_->rendezvous_min_bytes(), kThreshold) << "UCX here has TCP only";
  EXPECT_EQ(a_->largest_eager_message(), kThreshold / 2);
}

// A buffer that is not a multiple of the cut, sent as messages of 128 KiB and the rest, lands
// whole in a receive posted with the same cut, from that sender or from any.
TEST_F(ThresholdMeshTest, CutBufferLandsWhole) {
  const size_t cut = a_->largest_eager_message();
  for (const bool from_any : {false, true}) {
    std::vector<uint8_t> source(8 * cut + 100);
    std::iota(source.begin(), source.end(), static_cast<uint8_t>(from_any ? 3 : 1));
    std::vector<uint8_t> target(source.size(), 0);
    Operation receive = b_->receive(45, ~uint64_t{0}, target.data(), target.size(),
                                    from_any ? std::nullopt : std::optional<PeerId>(b_to_a_), cut);
    Operation send = a_->send(a_to_b_, 45, source.data(), source.size(), cut);
    drive({&send, &receive});
    EXPECT_EQ(send.status(), UCS_OK);
    EXPECT_EQ(receive.status(), UCS_OK);
    EXPECT_EQ(receive.received_bytes(), source.size());
    EXPECT_EQ(target, source);
  }
  EXPECT_EQ(a_->unfinished_sends(), 0u);
}

// Cut below the threshold, a buffer goes without a rendezvous: the send finishes before any
// receive is posted (UCX holds the messages as unexpected), which a rendezvous never does.
TEST_F(ThresholdMeshTest, CutBufferGoesWithoutRendezvous) {
  const size_t cut = a_->largest_eager_message();
  std::vector<uint8_t> source(4 * cut, 9);
  std::vector<uint8_t> target(source.size(), 0);
  Operation whole = a_->send(a_to_b_, 46, source.data(), source.size());
  drive_for(std::chrono::milliseconds(300), [&] { return whole.done(); });
  EXPECT_FALSE(whole.done()) << "one message above the threshold waits for its receive";
  Operation cut_send = a_->send(a_to_b_, 47, source.data(), source.size(), cut);
  drive_for(std::chrono::seconds(10), [&] { return cut_send.done(); });
  ASSERT_TRUE(cut_send.done()) << "eager messages went out with no receive posted";
  EXPECT_EQ(cut_send.status(), UCS_OK);
  Operation cut_receive =
      b_->receive(47, ~uint64_t{0}, target.data(), target.size(), std::nullopt, cut);
  drive({&cut_receive});
  EXPECT_EQ(target, source);
  std::vector<uint8_t> drained(source.size(), 0);
  Operation drain = b_->receive(46, ~uint64_t{0}, drained.data(), drained.size());
  drive({&whole, &drain});
  EXPECT_EQ(drained, source);
}

// A cut send released before it finished stops counting; a cut receive dropped before any of
// its messages came is cancelled whole, and the messages land in the next receive instead.
TEST_F(ThresholdMeshTest, ReleasedCutOperationsLeaveNothingBehind) {
  const size_t cut = a_->largest_eager_message();
  std::vector<uint8_t> source(64 * cut, 5);  // more than the sockets hold
  std::vector<uint8_t> target(source.size(), 0);
  {
    Operation dropped =
        b_->receive(48, ~uint64_t{0}, target.data(), target.size(), std::nullopt, cut);
    EXPECT_FALSE(dropped.done());
  }
  {
    Operation released = a_->send(a_to_b_, 48, source.data(), source.size(), cut);
    ASSERT_FALSE(released.done());
    EXPECT_EQ(a_->unfinished_sends(), 1u) << "a cut send counts once";
  }
  EXPECT_EQ(a_->unfinished_sends(), 0u) << "a released send no longer counts";
  Operation receive =
      b_->receive(48, ~uint64_t{0}, target.data(), target.size(), std::nullopt, cut);
  drive({&receive});
  EXPECT_EQ(receive.received_bytes(), source.size());
  EXPECT_EQ(target, source);
  drive_for(std::chrono::seconds(10), [&] { return a_->unfinished_sends() == 0; });
}

// A send UCX holds back is counted until it finishes, or until its Operation lets it go: the
// engine polls instead of sleeping while any is (nothing wakes it when a TCP socket drains).
TEST_F(MeshTest, CountsSendsUcxHasNotFinished) {
  EXPECT_EQ(a_->unfinished_sends(), 0u);
  std::vector<uint8_t> source(32 << 20, 7);  // more than a socket buffer holds
  std::vector<uint8_t> target(source.size());
  Operation send = a_->send(a_to_b_, 43, source.data(), source.size());
  ASSERT_FALSE(send.done());
  EXPECT_EQ(a_->unfinished_sends(), 1u);
  Operation receive = b_->receive(43, ~uint64_t{0}, target.data(), target.size());
  drive({&send, &receive});
  EXPECT_EQ(a_->unfinished_sends(), 0u);
  EXPECT_EQ(target, source);
  {
    Operation dropped = a_->send(a_to_b_, 44, source.data(), source.size());
    ASSERT_FALSE(dropped.done());
    EXPECT_EQ(a_->unfinished_sends(), 1u);
  }
  EXPECT_EQ(a_->unfinished_sends(), 0u) << "a released send no longer counts";
  // What the released send still delivers lands in a receive of its own, not in a later test.
  Operation drain = b_->receive(44, ~uint64_t{0}, target.data(), target.size());
  drive({&drain});
}

TEST(NetworkTransports, ListsTcpAndNoSharedMemory) {
  const std::vector<std::string> names = network_transports();
  EXPECT_THAT(names, ::testing::Contains("tcp"));
  for (const char* local : {"posix", "sysv", "cma", "self", "xpmem", "knem"}) {
    EXPECT_THAT(names, ::testing::Not(::testing::Contains(local)));
  }
}

TEST(NetworkTransports, TheRendezvousIsSetOnlyWhereEveryNetworkTransportIsTcp) {
  EXPECT_TRUE(tcp_only({"tcp"}));
  EXPECT_FALSE(tcp_only({"rc_mlx5", "tcp", "ud_mlx5"}));
  EXPECT_FALSE(tcp_only({}));
}

TEST_F(MeshTest, TagMaskSelectsBySender) {
  // High bits name the sender; a receive for "any tag from A" matches only A's message.
  uint32_t value = 99, got = 0;
  Operation receive = b_->receive(uint64_t{1} << 56, uint64_t{0xff} << 56, &got, sizeof(got));
  Operation send = a_->send(a_to_b_, (uint64_t{1} << 56) | 12345, &value, sizeof(value));
  drive({&send, &receive});
  EXPECT_EQ(got, 99u);
}

// (A peer in this process says goodbye as it goes; one killed outright is the cluster tests'
// KilledPeerDaemonFailsSurvivingRanksWithinTenSeconds.)
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

// Control messages land in one receive buffer that grows to the largest: each is whole, small
// after large and large after small. (Sizes UCX sends eagerly: poll_message waits for the rest
// of a rendezvous message, which only the sender's progress, in this thread, would send.)
TEST_F(MeshTest, PolledMessagesOfEverySizeArriveWhole) {
  const std::vector<size_t> sizes = {3, 2000, 5, 6000, 64};
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> bytes(sizes[i]);
    std::iota(bytes.begin(), bytes.end(), static_cast<uint8_t>(i));
    a_->post(a_to_b_, 6, std::make_shared<const std::vector<uint8_t>>(bytes));
    std::optional<Mesh::Message> message;
    drive_until([&] { return (message = b_->poll_message(6, ~uint64_t{0})).has_value(); });
    EXPECT_EQ(std::vector<uint8_t>(message->payload.begin(), message->payload.end()), bytes)
        << "message " << i;
  }
}

// Polls `mesh` for messages tagged `tag` until one is lost (or 20 s pass): none may arrive
// whole, nor may polling throw.
void poll_until_lost(Mesh& mesh, uint64_t tag) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (mesh.lost_messages() == 0 && Clock::now() < deadline) {
    mesh.progress();
    std::optional<Mesh::Message> message;
    ASSERT_NO_THROW(message = mesh.poll_message(tag, ~uint64_t{0}));
    ASSERT_FALSE(message) << "a message whose sender went arrived whole";
  }
}

// A peer that dies with a large message announced but not yet read: the receive fails, and
// poll_message drops it (counted) instead of throwing at its caller, whose other peers and
// jobs are fine.
TEST_F(MeshTest, AMessageWhoseSenderDiedIsDroppedAndCounted) {
  a_->post(a_to_b_, 5, std::make_shared<const std::vector<uint8_t>>(std::vector<uint8_t>(4 << 20)));
  const auto announced = Clock::now() + std::chrono::milliseconds(300);
  while (Clock::now() < announced) {
    a_->progress();
    b_->progress();
  }
  a_.reset();
  poll_until_lost(*b_, 5);
  EXPECT_EQ(b_->lost_messages(), 1u);
}

// A 64 MiB eager message (many fragments) from `a` to `b`, driven until its first fragments
// are in and the rest are not; then `b` retires the receive with its memory: the message is
// cut off half-way once the sender goes. `send` reads `source` until then.
struct RetiredCutOff {
  std::shared_ptr<std::vector<float>> source;
  Operation send;
  std::weak_ptr<std::vector<float>> memory;  // the retired receive's
};

RetiredCutOff retire_half_received(Mesh& a, PeerId a_to_b, Mesh& b, PeerId b_to_a, uint64_t tag) {
  RetiredCutOff cut;
  cut.source = std::make_shared<std::vector<float>>(16 << 20, 1.0f);
  auto target = std::make_shared<std::vector<float>>(cut.source->size(), 0.0f);
  const size_t bytes = target->size() * sizeof(float);
  Operation receive = b.receive(tag, ~uint64_t{0}, target->data(), bytes, b_to_a);
  cut.send = a.send(a_to_b, tag, cut.source->data(), bytes);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (target->front() == 0.0f && Clock::now() < deadline) {
    a.progress();
    b.progress();
  }
  EXPECT_NE(target->front(), 0.0f) << "the first fragment did not arrive in 10 s";
  EXPECT_FALSE(receive.done()) << "the whole message arrived before its sender went";
  cut.memory = target;
  std::vector<Operation> operations;
  operations.push_back(std::move(receive));
  b.retire(std::move(operations), {std::move(target)});
  return cut;
}

// UCX never finishes a receive whose eager message was cut off half-way (the sender's
// connection broke between fragments), nor can it be cancelled. Retired, its memory must still
// go, once the connection that could bring the rest has closed: without that, a failed job's
// buffers stayed mapped in the daemon for good (tests/netns/link_fault_test.sh).
TEST_F(EagerMeshTest, AReceiveCutOffHalfWayGivesItsMemoryBackOnceTheSenderIsGone) {
  RetiredCutOff cut = retire_half_received(*a_, a_to_b_, *b_, b_to_a_, 11);
  const std::weak_ptr<std::vector<float>> memory = cut.memory;
  for (int i = 0; i < 100; ++i) b_->progress();
  EXPECT_FALSE(memory.expired()) << "released while the sender could still send the rest";
  cut.send = Operation();
  a_.reset();  // the sender goes, its connection with it
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!memory.expired() && Clock::now() < deadline) b_->progress();
  EXPECT_TRUE(memory.expired()) << "the receive's memory is still held";
  EXPECT_EQ(b_->retired_count(), 0u);
}

// The same with a third daemon on the same host, connected both ways and alive: its
// connections carry its own data only, so the dead sender's cut-off receive still gives its
// memory back (counted among the receive's feeders for sharing a host, they held it for good:
// a loopback cluster's node kept a failed job's buffer mapped).
TEST_F(EagerMeshTest, AHealthyPeerOnTheSameHostDoesNotHoldACutOffReceive) {
  auto c = std::make_unique<Mesh>(options());
  const PeerId c_to_b = c->connect("127.0.0.1:" + std::to_string(b_->port()));
  const PeerId b_to_c = b_->connect("127.0.0.1:" + std::to_string(c->port()));
  drive_until([&] {
    c->progress();
    return c->authenticated(c_to_b) && b_->authenticated(b_to_c);
  });
  RetiredCutOff cut = retire_half_received(*a_, a_to_b_, *b_, b_to_a_, 12);
  const std::weak_ptr<std::vector<float>> memory = cut.memory;
  cut.send = Operation();
  a_.reset();  // the sender goes; c stays, connected to b
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!memory.expired() && Clock::now() < deadline) {
    b_->progress();
    c->progress();
  }
  EXPECT_TRUE(memory.expired()) << "the healthy peer's connection held the receive's memory";
  EXPECT_EQ(b_->retired_count(), 0u);
  EXPECT_FALSE(b_->failed(b_to_c)) << "the healthy peer was given up on";
}

// The same cut in a control message: poll_message gives up on it within the liveness timeout
// instead of waiting for ever, drops it, and names its tag, so that its job can be failed.
TEST_F(EagerMeshTest, AControlMessageCutOffHalfWayIsDroppedWithinABound) {
  a_->post(a_to_b_, 5,
           std::make_shared<const std::vector<uint8_t>>(std::vector<uint8_t>(64 << 20, 1)));
  // The sender fills the socket (a few MiB of fragments) while the receiver reads none, then
  // goes: the receiver finds the first fragments, and the rest never comes.
  const auto sent = Clock::now() + std::chrono::milliseconds(200);
  while (Clock::now() < sent) a_->progress();
  a_.reset();
  poll_until_lost(*b_, 5);
  EXPECT_EQ(b_->lost_messages(), 1u);
  EXPECT_EQ(b_->take_lost_messages(), std::vector<uint64_t>{5});
}

// A peer that shuts down says so on our connection to it: we fail it at once, as having left
// rather than broken, without sending it anything.
TEST_F(MeshTest, APeerThatShutsDownSaysGoodbye) {
  b_.reset();
  std::vector<PeerId> failed;
  drive_until([&] {
    failed = a_->take_failed_peers();
    return !failed.empty();
  });
  ASSERT_EQ(failed, std::vector<PeerId>{a_to_b_});
  EXPECT_TRUE(a_->left(a_to_b_));
  EXPECT_EQ(a_->failure(a_to_b_), "it shut down");
}

TEST_F(MeshTest, ReconnectsToARestartedPeer) {
  const std::string address = "127.0.0.1:" + std::to_string(b_->port());
  b_.reset();
  uint64_t value = 7, got = 0;
  drive_until([&] {
    Operation probe = a_->send(a_to_b_, 2, &value, sizeof(value));
    a_->progress();
    return a_->failed(a_to_b_);
  });
  ASSERT_EQ(a_->take_failed_peers(), std::vector<PeerId>{a_to_b_});
  b_ = std::make_unique<Mesh>(MeshOptions{address});  // the daemon restarted
  EXPECT_EQ(a_->connect(address), a_to_b_) << "a restarted peer keeps its id";
  EXPECT_FALSE(a_->failed(a_to_b_));
  drive_until([&] { return a_->authenticated(a_to_b_); });
  Operation receive = b_->receive(9, ~uint64_t{0}, &got, sizeof(got));
  Operation send = a_->send(a_to_b_, 9, &value, sizeof(value));
  drive({&send, &receive});
  EXPECT_EQ(got, value);
}

TEST_F(MeshTest, LivenessCheckKeepsAPeerThatAnswersAndFailsOneThatDoesNot) {
  MeshOptions quick{"127.0.0.1:0"};
  quick.liveness_timeout = std::chrono::milliseconds(300);
  a_ = std::make_unique<Mesh>(quick);
  a_to_b_ = a_->connect("127.0.0.1:" + std::to_string(b_->port()));
  drive_until([&] { return a_->authenticated(a_to_b_); });
  a_->check_alive(a_to_b_);
  const auto answered_by = Clock::now() + std::chrono::milliseconds(600);
  while (Clock::now() < answered_by) {
    a_->progress();
    b_->progress();
  }
  EXPECT_FALSE(a_->failed(a_to_b_)) << a_->failure(a_to_b_);
  a_->take_handshake_outcomes();
  EXPECT_FALSE(a_->needs_service()) << "the answered check is done";
  // A peer that never answers (a cut link carries nothing; here B is simply not driven).
  a_->check_alive(a_to_b_);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!a_->failed(a_to_b_) && Clock::now() < deadline) a_->progress();
  ASSERT_TRUE(a_->failed(a_to_b_));
  EXPECT_THAT(a_->failure(a_to_b_), ::testing::HasSubstr("did not answer a liveness check"));
  EXPECT_EQ(a_->take_failed_peers(), std::vector<PeerId>{a_to_b_});
}

// Two meshes with the given keys, connected both ways, driven until each side's handshake
// to the other has ended.
class HandshakeTest : public ::testing::Test {
 protected:
  static std::optional<ClusterKey> key(std::string_view text) {
    return ClusterKey(std::vector<uint8_t>(text.begin(), text.end()));
  }
  static MeshOptions options(std::optional<ClusterKey> cluster_key) {
    MeshOptions options{"127.0.0.1:0"};
    options.cluster_key = std::move(cluster_key);
    return options;
  }
  void connect(const MeshOptions& a, const MeshOptions& b) {
    a_ = std::make_unique<Mesh>(a);
    b_ = std::make_unique<Mesh>(b);
    a_to_b_ = a_->connect("127.0.0.1:" + std::to_string(b_->port()));
    b_to_a_ = b_->connect("127.0.0.1:" + std::to_string(a_->port()));
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    auto ended = [](const Mesh& mesh, PeerId peer) {
      return mesh.authenticated(peer) || mesh.failed(peer);
    };
    while (!ended(*a_, a_to_b_) || !ended(*b_, b_to_a_)) {
      a_->progress();
      b_->progress();
      ASSERT_LT(Clock::now(), deadline) << "the handshakes did not end in 10 s";
    }
    // Let the refusals and closes on the other side land.
    const auto settle = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < settle) {
      a_->progress();
      b_->progress();
    }
    a_outcomes_ = a_->take_handshake_outcomes();
    b_outcomes_ = b_->take_handshake_outcomes();
  }
  static constexpr size_t kLanes = 2;  // a daemon's connections to each peer (transport::Lane)
  static size_t count(const std::vector<HandshakeOutcome>& outcomes, bool inbound, bool accepted) {
    return static_cast<size_t>(std::count_if(outcomes.begin(), outcomes.end(), [&](const auto& o) {
      return o.inbound == inbound && o.accepted == accepted;
    }));
  }
  std::unique_ptr<Mesh> a_, b_;
  PeerId a_to_b_ = 0, b_to_a_ = 0;
  std::vector<HandshakeOutcome> a_outcomes_, b_outcomes_;
};

TEST_F(HandshakeTest, SameKeyIsAcceptedBothWays) {
  connect(options(key("a shared cluster key, 32 bytes!")),
          options(key("a shared cluster key, 32 bytes!")));
  EXPECT_TRUE(a_->authenticated(a_to_b_));
  EXPECT_TRUE(b_->authenticated(b_to_a_));
  // Each daemon makes a connection for each lane, and hears of its peer's as one.
  EXPECT_EQ(count(a_outcomes_, true, true), kLanes);
  EXPECT_EQ(count(a_outcomes_, false, true), 1u);
  EXPECT_EQ(count(b_outcomes_, true, true), kLanes);
  ASSERT_EQ(b_outcomes_.size(), kLanes + 1);
  // The inbound side learns who connected from the (proved) Hello.
  for (const auto& outcome : b_outcomes_) {
    if (outcome.inbound) {
      EXPECT_EQ(outcome.address, "127.0.0.1:" + std::to_string(a_->port()));
    }
  }
}

TEST_F(HandshakeTest, AnotherKeyIsRefusedBothWays) {
  connect(options(key("the cluster key of cluster one.")),
          options(key("the cluster key of cluster two.")));
  ASSERT_TRUE(a_->failed(a_to_b_));
  ASSERT_TRUE(b_->failed(b_to_a_));
  EXPECT_THAT(a_->failure(a_to_b_), ::testing::HasSubstr("did not prove the cluster key"));
  EXPECT_THAT(b_->failure(b_to_a_), ::testing::HasSubstr("did not prove the cluster key"));
  EXPECT_EQ(count(a_outcomes_, false, false), 1u);
  EXPECT_EQ(count(a_outcomes_, true, false), kLanes)
      << "the refused peer's connections are dropped";
  EXPECT_EQ(count(a_outcomes_, true, true) + count(a_outcomes_, false, true), 0u);
  uint64_t value = 1;
  Operation send = a_->send(a_to_b_, 1, &value, sizeof(value));
  EXPECT_TRUE(send.done());
  EXPECT_NE(send.status(), UCS_OK) << "nothing goes to a refused peer";
  EXPECT_EQ(a_->take_failed_peers(), std::vector<PeerId>{a_to_b_});
}

TEST_F(HandshakeTest, KeyAndNoKeyRefuseEachOther) {
  connect(options(key("a cluster key only one side has")), options(std::nullopt));
  ASSERT_TRUE(a_->failed(a_to_b_));
  ASSERT_TRUE(b_->failed(b_to_a_));
  EXPECT_THAT(a_->failure(a_to_b_),
              ::testing::HasSubstr("the connecting daemon has a cluster key, and this one has "
                                   "none"));
  EXPECT_THAT(b_->failure(b_to_a_),
              ::testing::HasSubstr("the connecting daemon has no cluster key, and this one "
                                   "requires it"));
  EXPECT_EQ(count(a_outcomes_, true, false), kLanes);
  EXPECT_EQ(count(b_outcomes_, true, false), kLanes);
}

TEST_F(HandshakeTest, AnotherVersionIsRefusedNamingBoth) {
  MeshOptions older = options(std::nullopt);
  older.version = "0.0.9";
  connect(older, options(std::nullopt));
  ASSERT_TRUE(a_->failed(a_to_b_));
  ASSERT_TRUE(b_->failed(b_to_a_));
  const std::string both = std::string("runs gradsync 0.0.9, this one ") + GRADSYNC_VERSION;
  EXPECT_THAT(a_->failure(a_to_b_), ::testing::HasSubstr(both)) << "refused by b, as it says";
  EXPECT_THAT(b_->failure(b_to_a_), ::testing::HasSubstr(std::string("runs gradsync ") +
                                                         GRADSYNC_VERSION + ", this one 0.0.9"));
  EXPECT_EQ(count(a_outcomes_, true, false), kLanes);
  EXPECT_EQ(count(b_outcomes_, true, false), kLanes);
}

TEST_F(HandshakeTest, ControlMessagesWaitForTheHandshake) {
  auto shared = key("a shared cluster key, 32 bytes!");
  a_ = std::make_unique<Mesh>(options(shared));
  b_ = std::make_unique<Mesh>(options(shared));
  a_to_b_ = a_->connect("127.0.0.1:" + std::to_string(b_->port()));
  EXPECT_FALSE(a_->authenticated(a_to_b_));
  uint64_t value = 5;
  Operation early = a_->send(a_to_b_, 3, &value, sizeof(value));
  EXPECT_TRUE(early.done());
  EXPECT_EQ(early.status(), UCS_ERR_NOT_CONNECTED) << "data waits for the handshake";
  a_->post(a_to_b_, 4, std::make_shared<const std::vector<uint8_t>>(std::vector<uint8_t>{1, 2, 3}));
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::optional<Mesh::Message> message;
  while (!message) {
    a_->progress();
    b_->progress();
    message = b_->poll_message(4, ~uint64_t{0});
    ASSERT_LT(Clock::now(), deadline) << "the posted message never arrived";
  }
  EXPECT_TRUE(a_->authenticated(a_to_b_)) << "it went only after the handshake";
  EXPECT_EQ(std::vector<uint8_t>(message->payload.begin(), message->payload.end()),
            (std::vector<uint8_t>{1, 2, 3}));
}

// A client that connects and never says a word (a port scanner, a hung process) is closed
// once the handshake timeout passes, and counted as refused.
TEST(Handshake, SilentConnectionIsClosedAfterTheTimeout) {
  MeshOptions options{"127.0.0.1:0"};
  options.handshake_timeout = std::chrono::milliseconds(300);
  Mesh server(options);
  Context context = create_context();
  Worker worker = create_worker(context.get());
  // It takes the server's refusal as UCX would deliver it to any program (UCX 1.13 crashes a
  // worker that gets an active message and never registered a handler).
  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
  handler.id = 1;
  handler.cb = [](void*, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
    return UCS_OK;
  };
  ASSERT_EQ(ucp_worker_set_am_recv_handler(worker.get(), &handler), UCS_OK);
  struct sockaddr_in address = parse_host_port("127.0.0.1:" + std::to_string(server.port()));
  bool closed = false;
  ucp_ep_h endpoint = connect_without_mesh(
      worker.get(), address,
      [](void* arg, ucp_ep_h, ucs_status_t) { *static_cast<bool*>(arg) = true; }, &closed);
  ASSERT_NE(endpoint, nullptr);
  std::vector<HandshakeOutcome> outcomes;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (outcomes.empty() || !closed) {
    server.progress();
    ucp_worker_progress(worker.get());
    for (auto& outcome : server.take_handshake_outcomes()) outcomes.push_back(outcome);
    ASSERT_LT(Clock::now(), deadline) << "the silent connection was not closed";
  }
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].inbound);
  EXPECT_FALSE(outcomes[0].accepted);
  EXPECT_THAT(outcomes[0].reason, ::testing::HasSubstr("within 300 ms"));
  EXPECT_FALSE(server.needs_service());
  close_at_once(worker.get(), endpoint);
}

// A client that goes away while its connection is being accepted (a peer daemon that exits
// as it connects): the accept fails inside UCX, which then releases the request itself. The
// server counts a refused connection and carries on; rejecting the request as well would
// touch freed memory.
TEST(Handshake, ConnectionGoneAsItIsAcceptedIsCountedAndLeftToUcx) {
  Mesh server(MeshOptions{"127.0.0.1:0"});
  struct sockaddr_in address = parse_host_port("127.0.0.1:" + std::to_string(server.port()));
  {
    Context context = create_context();
    Worker worker = create_worker(context.get());
    ucp_ep_h endpoint = connect_without_mesh(
        worker.get(), address, [](void*, ucp_ep_h, ucs_status_t) {}, nullptr);
    ASSERT_NE(endpoint, nullptr);
    // The request reaches the server's listener (UCX's own thread takes it in); the server
    // does not progress, so it is not accepted yet.
    const auto until = Clock::now() + std::chrono::milliseconds(200);
    while (Clock::now() < until) ucp_worker_progress(worker.get());
    close_at_once(worker.get(), endpoint);
  }  // the client's worker and context go: its sockets close
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<HandshakeOutcome> outcomes;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (outcomes.empty()) {
    server.progress();
    for (auto& outcome : server.take_handshake_outcomes()) outcomes.push_back(outcome);
    ASSERT_LT(Clock::now(), deadline) << "the connection that went was not counted";
  }
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].inbound);
  EXPECT_FALSE(outcomes[0].accepted);
  // Still serving: two meshes connect to it and exchange a message.
  Mesh client(MeshOptions{"127.0.0.1:0"});
  const PeerId to_server = client.connect("127.0.0.1:" + std::to_string(server.port()));
  const PeerId to_client = server.connect("127.0.0.1:" + std::to_string(client.port()));
  while (!client.authenticated(to_server) || !server.authenticated(to_client)) {
    client.progress();
    server.progress();
    ASSERT_LT(Clock::now(), deadline) << "the server no longer accepts connections";
  }
}

TEST(HostPort, ParsesAndRejects) {
  const auto address = parse_host_port("198.18.0.2:9478");
  EXPECT_EQ(ntohs(address.sin_port), 9478);
  EXPECT_THROW(parse_host_port("198.18.0.2"), std::invalid_argument);
  EXPECT_THROW(parse_host_port("host:1"), std::invalid_argument);
  EXPECT_THROW(parse_host_port("1.2.3.4:70000"), std::invalid_argument);
}

// A specific address is where peers reach the daemon; for every address (0.0.0.0) one of the
// host's own stands in, never loopback, or the error names the fix.
TEST(ReachableAddress, IsTheListenAddressOrOneOfTheHosts) {
  EXPECT_EQ(reachable_address("198.18.0.5:9478"), "198.18.0.5:9478");
  EXPECT_THROW(reachable_address("198.18.0.5"), std::invalid_argument);
  try {
    const std::string address = reachable_address("0.0.0.0:9478");
    EXPECT_TRUE(address.ends_with(":9478")) << address;
    EXPECT_FALSE(address.starts_with("0.0.0.0") || address.starts_with("127.")) << address;
    EXPECT_NO_THROW(parse_host_port(address));
  } catch (const std::runtime_error& e) {  // a host with loopback alone
    EXPECT_NE(std::string(e.what()).find("set `listen`"), std::string::npos) << e.what();
  }
}

// A daemon refuses at start an address no interface has (127.0.0.2 binds, but UCX would fail
// every connection to it), and names the address; an interface's or every address is fine.
TEST(ListenAddress, MustBeAnInterfacesAddress) {
  EXPECT_NO_THROW(check_listen_address("127.0.0.1:0"));
  EXPECT_NO_THROW(check_listen_address("0.0.0.0:9478"));
  try {
    check_listen_address("127.0.0.2:9478");
    ADD_FAILURE() << "127.0.0.2 was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Mesh(MeshOptions{"127.0.0.2:0"}), std::runtime_error);
}

}  // namespace
}  // namespace gradsync::transport
