#include "ipc/frame_socket.h"
#include "ipc/messages.h"
#include "ipc/protocol.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

namespace gradsync::ipc {
namespace {

class FrameSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a_.reset(fds[0]);
    b_.reset(fds[1]);
  }
  Frame read_one() {
    while (true) {
      if (auto f = reader_.next_frame()) return std::move(*f);
      EXPECT_NE(reader_.read_some(b_.get()), FrameReader::ReadResult::kClosed);
    }
  }
  UniqueFd a_, b_;
  FrameReader reader_;
};

TEST_F(FrameSocketTest, FramesArriveWhole) {
  const std::vector<uint8_t> one = {1, 2, 3};
  const std::vector<uint8_t> two(5000, 7);
  send_frame(a_.get(), one);
  send_frame(a_.get(), two);
  EXPECT_EQ(read_one().payload, one);
  EXPECT_EQ(read_one().payload, two);
}

TEST_F(FrameSocketTest, FrameSplitAcrossWritesIsReassembled) {
  const uint32_t length = 6;
  const uint8_t payload[6] = {9, 8, 7, 6, 5, 4};
  ASSERT_EQ(::write(a_.get(), &length, 2), 2);
  EXPECT_EQ(reader_.read_some(b_.get()), FrameReader::ReadResult::kProgress);
  EXPECT_FALSE(reader_.next_frame());
  ASSERT_EQ(::write(a_.get(), reinterpret_cast<const uint8_t*>(&length) + 2, 2), 2);
  ASSERT_EQ(::write(a_.get(), payload, 3), 3);
  reader_.read_some(b_.get());
  EXPECT_FALSE(reader_.next_frame());
  ASSERT_EQ(::write(a_.get(), payload + 3, 3), 3);
  const Frame frame = read_one();
  EXPECT_EQ(frame.payload, std::vector<uint8_t>(payload, payload + 6));
}

TEST_F(FrameSocketTest, FileDescriptorsTravelWithTheirFrame) {
  UniqueFd memfd = create_sealed_memfd("test", 4096);
  const int fd = memfd.get();
  send_frame(a_.get(), std::vector<uint8_t>{1}, std::span<const int>(&fd, 1));
  Frame frame = read_one();
  ASSERT_EQ(frame.fds.size(), 1u);
  EXPECT_EQ(sealed_memfd_size(frame.fds[0].get()), 4096u);
}

TEST_F(FrameSocketTest, OversizedLengthIsAProtocolError) {
  const uint32_t length = kMaxFrameBytes + 1;
  ASSERT_EQ(::write(a_.get(), &length, 4), 4);
  EXPECT_THROW(reader_.read_some(b_.get()), ProtocolError);
}

TEST_F(FrameSocketTest, ClosedPeerIsReported) {
  a_.reset();
  EXPECT_EQ(reader_.read_some(b_.get()), FrameReader::ReadResult::kClosed);
}

TEST(Messages, GarbageIsRejected) {
  const std::vector<uint8_t> garbage(64, 0xff);
  EXPECT_ANY_THROW({
    DecodedMessage message(garbage);
    message.root<wire::Request>().which();
  });
  const std::vector<uint8_t> odd(13, 0);
  EXPECT_THROW(DecodedMessage{odd}, ProtocolError);
}

TEST(Messages, RoundTrip) {
  capnp::MallocMessageBuilder builder;
  auto hello = builder.initRoot<wire::Request>().initHello();
  hello.setJob("job-1");
  hello.setLocalWorldSize(4);
  const auto bytes = encode(builder);
  DecodedMessage decoded(bytes);
  const auto request = decoded.root<wire::Request>();
  ASSERT_TRUE(request.isHello());
  EXPECT_STREQ(request.getHello().getJob().cStr(), "job-1");
  EXPECT_EQ(request.getHello().getLocalWorldSize(), 4);
}

TEST(Memfd, UnsealedMemfdIsRefused) {
  UniqueFd fd(::memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::ftruncate(fd.get(), 4096), 0);
  EXPECT_THROW(sealed_memfd_size(fd.get()), SystemError);
}

}  // namespace
}  // namespace gradsync::ipc
