// Input no well-behaved client sends, straight onto the socket and the rings. Each case: the
// sender gets a clear error, and the daemon goes on serving everyone else.
#include "tests/integration/harness.h"

#include "ipc/protocol.h"

#include <sys/mman.h>
#include <unistd.h>

#include <thread>

namespace gradsync::testing {
namespace {

class BadInputTest : public DaemonTest {
 protected:
  void SetUp() override { start_daemon(); }

  // After each case: a normal job still works on this daemon.
  void TearDown() override {
    auto ranks = spawn_ranks("bystander", 2, {"grouped"});
    expect_all_succeed(ranks);
    DaemonTest::TearDown();
  }
};

TEST_F(BadInputTest, GarbageFrameGetsAProtocolErrorAndIsDisconnected) {
  RawClient client(socket());
  const uint32_t length = 24;
  client.send_bytes(&length, 4);
  const std::vector<uint8_t> garbage(24, 0xee);
  client.send_bytes(garbage.data(), garbage.size());
  const auto [code, message] = client.receive_status();
  EXPECT_EQ(code, GRADSYNC_ERR_PROTOCOL);
  EXPECT_NE(message.find("malformed"), std::string::npos) << message;
  EXPECT_TRUE(client.closed_by_daemon());
}

TEST_F(BadInputTest, OversizedFrameIsRefused) {
  RawClient client(socket());
  const uint32_t length = ipc::kMaxFrameBytes + 8;
  client.send_bytes(&length, 4);
  const auto [code, message] = client.receive_status();
  EXPECT_EQ(code, GRADSYNC_ERR_PROTOCOL);
  EXPECT_NE(message.find("exceeds"), std::string::npos) << message;
  EXPECT_TRUE(client.closed_by_daemon());
}

TEST_F(BadInputTest, UnknownProtocolVersionIsNamed) {
  RawClient client(socket());
  const auto [code, message] = client.hello("job", 0, 1, ipc::kProtocolVersion + 7);
  EXPECT_EQ(code, GRADSYNC_ERR_PROTOCOL);
  EXPECT_NE(message.find("protocol version"), std::string::npos) << message;
}

TEST_F(BadInputTest, FirstMessageMustBeHello) {
  RawClient client(socket());
  const auto [code, message] = client.register_buffer(1, -1, 0, 4096);
  EXPECT_EQ(code, GRADSYNC_ERR_PROTOCOL);
  EXPECT_NE(message.find("hello"), std::string::npos) << message;
}

TEST_F(BadInputTest, InconsistentIdentityIsRefused) {
  RawClient client(socket());
  const auto [code, message] = client.hello("job", 5, 2);
  EXPECT_EQ(code, GRADSYNC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("local rank 5 of 2"), std::string::npos) << message;
  RawClient bad_name(socket());
  EXPECT_EQ(bad_name.hello("job/../x", 0, 1).first, GRADSYNC_ERR_INVALID_ARGUMENT);
}

TEST_F(BadInputTest, SecondClaimOnALocalRankIsRefused) {
  RawClient first(socket());
  ASSERT_EQ(first.hello("dup", 0, 2).first, 0u);
  RawClient second(socket());
  const auto [code, message] = second.hello("dup", 0, 2);
  EXPECT_EQ(code, GRADSYNC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("already connected"), std::string::npos) << message;
}

TEST_F(BadInputTest, DoubleRegistrationIsRefused) {
  RawClient client(socket());
  ASSERT_EQ(client.hello("reg", 0, 1).first, 0u);
  ipc::UniqueFd memfd = ipc::create_sealed_memfd("test", 1 << 16);
  EXPECT_EQ(client.register_buffer(3, memfd.get(), 0, 4096).first, 0u);
  const auto [code, message] = client.register_buffer(3, memfd.get(), 4096, 4096);
  EXPECT_EQ(code, GRADSYNC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("already registered"), std::string::npos) << message;
}

TEST_F(BadInputTest, RegistrationOutsideTheSegmentIsRefused) {
  RawClient client(socket());
  ASSERT_EQ(client.hello("range", 0, 1).first, 0u);
  ipc::UniqueFd memfd = ipc::create_sealed_memfd("test", 1 << 16);
  auto [code, message] = client.register_buffer(1, memfd.get(), (1 << 16) - 4096, 8192);
  EXPECT_EQ(code, GRADSYNC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("outside"), std::string::npos) << message;
  std::tie(code, message) = client.register_buffer(2, memfd.get(), UINT64_MAX - 10, 100);
  EXPECT_EQ(code, GRADSYNC_ERR_INVALID_ARGUMENT);
}

TEST_F(BadInputTest, UnsealedMemoryIsRefused) {
  // A segment its owner could shrink would make the daemon fault with SIGBUS.
  RawClient client(socket());
  ASSERT_EQ(client.hello("unsealed", 0, 1).first, 0u);
  ipc::UniqueFd memfd(::memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(memfd.get(), 8192), 0);
  const auto [code, message] = client.register_buffer(1, memfd.get(), 0, 4096);
  EXPECT_EQ(code, GRADSYNC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("sealed"), std::string::npos) << message;
}

TEST_F(BadInputTest, DeviceRegistrationsAreCheckedAndCostTheClientNothingElse) {
  RawClient client(socket());
  ASSERT_EQ(client.hello("device", 0, 1).first, 0u);
  const std::vector<uint8_t> handle(64, 0x5a);
  const std::vector<uint8_t> uuid(16, 0xa5);
  // Device memory comes with no file descriptor.
  ipc::UniqueFd memfd = ipc::create_sealed_memfd("test", 1 << 16);
  auto [code, message_text] = client.register_device(1, 0, 4096, handle, uuid, memfd.get());
  EXPECT_EQ(code, GRADSYNC_ERR_PROTOCOL);
  EXPECT_NE(message_text.find("expected 0 file descriptors"), std::string::npos) << message_text;
  // A handle of the wrong size: refused for that where the daemon has a GPU; where it has
  // none (CI), refused for that first, with the reason.
  std::tie(code, message_text) = client.register_device(2, 0, 4096, {1, 2, 3}, uuid);
  if (code == GRADSYNC_ERR_UNSUPPORTED) {
    EXPECT_NE(message_text.find("device memory is not served here"), std::string::npos)
        << message_text;
    EXPECT_NE(message_text.find("host memory only"), std::string::npos) << message_text;
  } else {
    EXPECT_EQ(code, GRADSYNC_ERR_INVALID_ARGUMENT) << message_text;
    EXPECT_NE(message_text.find("64 bytes"), std::string::npos) << message_text;
  }
  // A well-formed handle no driver issued: never served.
  std::tie(code, message_text) = client.register_device(3, 0, 4096, handle, uuid);
  EXPECT_TRUE(code == GRADSYNC_ERR_UNSUPPORTED || code == GRADSYNC_ERR_INVALID_ARGUMENT)
      << code << ": " << message_text;
  // VMM memory comes with one fd per segment...
  std::tie(code, message_text) =
      client.register_vmm(4, 0, 4096, {1 << 16, 1 << 16}, {memfd.get()}, uuid);
  EXPECT_EQ(code, GRADSYNC_ERR_PROTOCOL);
  EXPECT_NE(message_text.find("expected 2 file descriptors, got 1"), std::string::npos)
      << message_text;
  // ...that the driver exported: a memfd is not one. Refused where the daemon has a GPU (the
  // driver will not import it), and where it has none (CI) for that first.
  std::tie(code, message_text) = client.register_vmm(5, 0, 4096, {1 << 16}, {memfd.get()}, uuid);
  if (code == GRADSYNC_ERR_UNSUPPORTED) {
    EXPECT_NE(message_text.find("device memory is not served here"), std::string::npos)
        << message_text;
  } else {
    EXPECT_EQ(code, GRADSYNC_ERR_INVALID_ARGUMENT) << message_text;
    EXPECT_NE(message_text.find("cuMemImportFromShareableHandle"), std::string::npos)
        << message_text;
  }
  // None of it registered anything, and host memory is served as before.
  ASSERT_EQ(client.register_buffer(1, memfd.get(), 0, 4096).first, 0u);
  auto* data = static_cast<float*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0));
  ASSERT_NE(data, MAP_FAILED);
  for (int i = 0; i < 1024; ++i) data[i] = static_cast<float>(i);
  client.submit(allreduce_entry("after-device", 1, 0, 1024));
  const ipc::CompletionEntry done = client.next_completion();
  EXPECT_EQ(done.status, GRADSYNC_OK) << std::string(done.message, done.message_length);
  EXPECT_EQ(data[1023], 1023.0f);  // one rank: the sum is its own input

  // Stream ordering is for device memory: on host memory it is an error, and the next
  // collective runs.
  ipc::SubmissionEntry ordered = allreduce_entry("ordered-host", 1, 0, 1024);
  ordered.flags |= ipc::kFlagStreamOrdered;
  ordered.event_slot = 0;
  client.submit(ordered);
  const ipc::CompletionEntry refused = client.next_completion();
  EXPECT_EQ(refused.status, GRADSYNC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(refused.message, refused.message_length).find("needs device memory"),
            std::string::npos);
  client.submit(allreduce_entry("after-ordered", 1, 0, 1024));
  EXPECT_EQ(client.next_completion().status, GRADSYNC_OK);
  ::munmap(data, 4096);

  // Events: no file descriptors, and not served without a device (with one, these made-up
  // handles fail to open).
  capnp::MallocMessageBuilder message;
  auto events = message.initRoot<ipc::wire::Request>().initRegisterEvents();
  events.initReadyEvents(2).set(0, kj::arrayPtr(handle.data(), handle.size()));
  events.setDeviceUuid(kj::arrayPtr(uuid.data(), uuid.size()));
  const int fd = memfd.get();
  client.send(message, std::span<const int>(&fd, 1));
  std::tie(code, message_text) = client.receive_status();
  EXPECT_EQ(code, GRADSYNC_ERR_PROTOCOL) << message_text;
  client.send(message);
  std::tie(code, message_text) = client.receive_status();
  EXPECT_TRUE(code == GRADSYNC_ERR_UNSUPPORTED || code == GRADSYNC_ERR_INVALID_ARGUMENT)
      << code << ": " << message_text;
  EXPECT_NE(message_text.find("register events"), std::string::npos) << message_text;
}

TEST_F(BadInputTest, HostMemoryOfferedAsDeviceMemoryIsRefusedThroughTheCppWrapper) {
  auto ranks = spawn_ranks("device-refused", 2, {"device_refused"});
  expect_all_succeed(ranks);
}

TEST_F(BadInputTest, RegistrationWithoutAFileDescriptorIsRefused) {
  RawClient client(socket());
  ASSERT_EQ(client.hello("nofd", 0, 1).first, 0u);
  const auto [code, message] = client.register_buffer(1, -1, 0, 4096);
  EXPECT_EQ(code, GRADSYNC_ERR_PROTOCOL);
  EXPECT_NE(message.find("file descriptor"), std::string::npos) << message;
}

class BadSubmissionTest : public BadInputTest {
 protected:
  void SetUp() override {
    BadInputTest::SetUp();
    client_ = std::make_unique<RawClient>(socket());
    ASSERT_EQ(client_->hello("ring", 0, 1).first, 0u);
    memfd_ = ipc::create_sealed_memfd("test", 1 << 16);
    ASSERT_EQ(client_->register_buffer(1, memfd_.get(), 0, 8192).first, 0u);
  }
  void expect_rejected(const ipc::SubmissionEntry& entry, const std::string& fragment) {
    client_->submit(entry);
    const ipc::CompletionEntry done = client_->next_completion();
    EXPECT_EQ(done.request, entry.request);
    EXPECT_EQ(done.status, static_cast<uint32_t>(GRADSYNC_ERR_INVALID_ARGUMENT));
    const std::string message(done.message, done.message_length);
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
  std::unique_ptr<RawClient> client_;
  ipc::UniqueFd memfd_;
};

TEST_F(BadSubmissionTest, ValidEntryCompletes) {
  client_->submit(allreduce_entry("ok", 1, 0, 2048));
  EXPECT_EQ(client_->next_completion().status, static_cast<uint32_t>(GRADSYNC_OK));
}

TEST_F(BadSubmissionTest, RangePastTheBufferEnd) {
  expect_rejected(allreduce_entry("past-end", 1, 8192 - 4, 2), "outside buffer 1");
}

TEST_F(BadSubmissionTest, CountOverflowingTheByteSize) {
  expect_rejected(allreduce_entry("overflow", 1, 0, UINT64_MAX / 2 + 1), "overflows");
}

TEST_F(BadSubmissionTest, NegativeSizeFromAMaliciousClient) {
  // A "negative" count is a huge unsigned one.
  expect_rejected(allreduce_entry("negative", 1, 0, static_cast<uint64_t>(-16)), "overflows");
}

TEST_F(BadSubmissionTest, UnknownBufferAndDtype) {
  expect_rejected(allreduce_entry("nobuf", 7, 0, 1), "not registered");
  auto entry = allreduce_entry("dtype", 1, 0, 1);
  entry.dtype = 99;
  expect_rejected(entry, "dtype");
}

TEST_F(BadSubmissionTest, NameWithoutTerminatorIsBounded) {
  auto entry = allreduce_entry("x", 1, 0, 1);
  std::memset(entry.name, 'a', sizeof(entry.name));
  entry.name_length = 100000;
  expect_rejected(entry, "name");
}

TEST_F(DaemonTest, InvalidSubmissionFailsThePeersOfItsTensorToo) {
  start_daemon();
  RawClient bad(socket());
  ASSERT_EQ(bad.hello("peer", 0, 2).first, 0u);
  ipc::UniqueFd memfd = ipc::create_sealed_memfd("test", 1 << 16);
  ASSERT_EQ(bad.register_buffer(1, memfd.get(), 0, 4096).first, 0u);
  RawClient good(socket());
  ASSERT_EQ(good.hello("peer", 1, 2).first, 0u);
  ASSERT_EQ(good.register_buffer(1, memfd.get(), 0, 4096).first, 0u);
  bad.submit(allreduce_entry("shared.name", 1, 4096, 1));  // past the end
  good.submit(allreduce_entry("shared.name", 1, 0, 1));
  const auto bad_done = bad.next_completion();
  const auto good_done = good.next_completion();
  EXPECT_EQ(bad_done.status, static_cast<uint32_t>(GRADSYNC_ERR_INVALID_ARGUMENT));
  EXPECT_EQ(good_done.status, static_cast<uint32_t>(GRADSYNC_ERR_INVALID_ARGUMENT));
  const std::string message(good_done.message, good_done.message_length);
  EXPECT_NE(message.find("local rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("shared.name"), std::string::npos) << message;
}

}  // namespace
}  // namespace gradsync::testing
