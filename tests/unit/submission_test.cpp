// The daemon's validation of ring entries: everything a hostile client can write.
#include "daemon/job/submission.h"

#include <gtest/gtest.h>

#include <cstring>

namespace gradsync::daemon {
namespace {

class SubmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage_.resize(4096 / sizeof(uint64_t));
    buffer_ = std::make_shared<HostBuffer>();
    buffer_->data = reinterpret_cast<uint8_t*>(storage_.data());
    buffer_->bytes = 4096;
    entry_ = ipc::SubmissionEntry{};
    entry_.request = 7;
    entry_.collective = static_cast<uint8_t>(ipc::Collective::kAllreduce);
    entry_.dtype = GRADSYNC_FLOAT32;
    entry_.op = GRADSYNC_SUM;
    entry_.send_buffer = 1;
    entry_.recv_buffer = 1;
    entry_.send_offset = 0;
    entry_.recv_offset = 2048;
    entry_.count = 512;
    set_name("grad");
  }
  void set_name(const std::string& name) {
    std::memcpy(entry_.name, name.data(), std::min(name.size(), sizeof(entry_.name)));
    entry_.name_length = static_cast<uint32_t>(name.size());
  }
  Submission resolve(int32_t local_rank = 0, int32_t ranks = 2) {
    return resolve_submission(
        entry_, [this](uint32_t id) { return id == 1 ? buffer_ : nullptr; }, local_rank, ranks);
  }
  void expect_invalid(const std::string& fragment, int32_t local_rank = 0) {
    const Submission s = resolve(local_rank);
    EXPECT_FALSE(s.valid());
    EXPECT_NE(s.error.find(fragment), std::string::npos) << s.error;
  }

  std::vector<uint64_t> storage_;
  std::shared_ptr<HostBuffer> buffer_;
  ipc::SubmissionEntry entry_{};
};

TEST_F(SubmissionTest, AcceptsAValidEntry) {
  const Submission s = resolve();
  ASSERT_TRUE(s.valid()) << s.error;
  EXPECT_EQ(s.name, "grad");
  EXPECT_EQ(s.send, buffer_->data);
  EXPECT_EQ(s.recv, buffer_->data + 2048);
  EXPECT_EQ(s.block_bytes(), 2048u);
}

TEST_F(SubmissionTest, DeviceMemoryIsResolvedToItsDevice) {
  // Buffer 1 is host memory; 2 and 3 are device memory on devices 0 and 1 (made up: no device
  // is touched in resolving).
  std::vector<uint64_t> device_storage(4096 / sizeof(uint64_t));
  auto lookup = [&](uint32_t id) -> RegisteredMemory {
    if (id == 1) return buffer_;
    if (id != 2 && id != 3) return {};
    RegisteredMemory memory;
    memory.data = reinterpret_cast<uint8_t*>(device_storage.data());
    memory.bytes = 4096;
    memory.device = id == 2 ? 0 : 1;
    memory.mapping = buffer_;  // anything that keeps it alive
    return memory;
  };
  entry_.send_buffer = 2;
  entry_.recv_buffer = 2;
  Submission s = resolve_submission(entry_, lookup, 0, 2);
  ASSERT_TRUE(s.valid()) << s.error;
  EXPECT_EQ(s.device, 0);
  EXPECT_EQ(s.recv, reinterpret_cast<uint8_t*>(device_storage.data()) + 2048);
  // Host send, device receive: refused, saying where each is.
  entry_.send_buffer = 1;
  s = resolve_submission(entry_, lookup, 0, 2);
  EXPECT_FALSE(s.valid());
  EXPECT_NE(s.error.find("send: host, receive: device 0"), std::string::npos) << s.error;
  // Two devices in one submission: refused too.
  entry_.send_buffer = 3;
  s = resolve_submission(entry_, lookup, 0, 2);
  EXPECT_NE(s.error.find("send: device 1, receive: device 0"), std::string::npos) << s.error;
  // A device buffer that could not be mapped again: its reason.
  auto failing = [](uint32_t /*id*/) {
    RegisteredMemory memory;
    memory.error = "cudaIpcOpenMemHandle: out of memory";
    return memory;
  };
  s = resolve_submission(entry_, failing, 0, 2);
  EXPECT_NE(s.error.find("send buffer 3: cudaIpcOpenMemHandle: out of memory"), std::string::npos)
      << s.error;
}

TEST_F(SubmissionTest, AcceptsInPlace) {
  entry_.recv_offset = 0;
  EXPECT_TRUE(resolve().valid());
}

// One buffer for both ranges: looked up once (a lookup touches the mapping cache), and both
// ranges hold it.
TEST_F(SubmissionTest, OneBufferForBothRangesIsLookedUpOnce) {
  int lookups = 0;
  const Submission s = resolve_submission(
      entry_,
      [&](uint32_t id) -> RegisteredMemory {
        ++lookups;
        return id == 1 ? buffer_ : nullptr;
      },
      0, 2);
  ASSERT_TRUE(s.valid()) << s.error;
  EXPECT_EQ(lookups, 1);
  EXPECT_EQ(s.send, buffer_->data);
  EXPECT_EQ(s.recv, buffer_->data + 2048);
  EXPECT_EQ(s.send_buffer, s.recv_buffer);
  EXPECT_EQ(buffer_.use_count(), 3) << "the test's, and one per range";
}

TEST_F(SubmissionTest, AcceptsARangeEndingExactlyAtTheBufferEnd) {
  entry_.recv_offset = 4096 - 2048;
  EXPECT_TRUE(resolve().valid());
}

TEST_F(SubmissionTest, RejectsOneElementPastTheEnd) {
  entry_.recv_offset = 4096 - 2048 + 4;
  expect_invalid("outside buffer 1");
}

TEST_F(SubmissionTest, RejectsCountThatOverflowsBytes) {
  entry_.count = UINT64_MAX / 2;
  expect_invalid("overflows");
}

TEST_F(SubmissionTest, RejectsOffsetThatOverflowsTheEnd) {
  entry_.send_offset = UINT64_MAX - 100;
  expect_invalid("outside buffer");
}

TEST_F(SubmissionTest, RejectsUnregisteredBuffers) {
  entry_.send_buffer = 9;
  expect_invalid("not registered");
}

TEST_F(SubmissionTest, RejectsMisalignedOffsets) {
  entry_.send_offset = 2;
  expect_invalid("aligned");
}

TEST_F(SubmissionTest, RejectsUnknownEnums) {
  entry_.dtype = 17;
  expect_invalid("dtype");
  SetUp();
  entry_.op = 9;
  expect_invalid("op");
  SetUp();
  entry_.collective = 200;
  expect_invalid("collective");
}

TEST_F(SubmissionTest, BitwiseOpsReduceIntegersOnly) {
  entry_.op = GRADSYNC_BXOR;
  expect_invalid("bxor reduces integers only, not float32");
  SetUp();
  entry_.op = GRADSYNC_BAND;
  entry_.dtype = GRADSYNC_BFLOAT16;
  expect_invalid("band reduces integers only, not bfloat16");
  for (const gradsync_dtype dtype : {GRADSYNC_INT32, GRADSYNC_INT64}) {
    for (const gradsync_op op : {GRADSYNC_BAND, GRADSYNC_BOR, GRADSYNC_BXOR}) {
      SetUp();
      entry_.dtype = dtype;
      entry_.op = op;
      entry_.count = 256;
      const Submission s = resolve();
      EXPECT_TRUE(s.valid()) << s.error;
    }
  }
  // A collective that does not reduce takes no op: a bitwise one left there is not checked.
  SetUp();
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kAllgather);
  entry_.op = GRADSYNC_BOR;
  entry_.count = 256;
  const Submission gather = resolve();
  EXPECT_TRUE(gather.valid()) << gather.error;
}

TEST_F(SubmissionTest, RejectsBadRoots) {
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kBroadcast);
  entry_.root = 2;
  expect_invalid("root");
  entry_.root = -1;
  expect_invalid("root");
}

TEST_F(SubmissionTest, RejectsBadNames) {
  entry_.name_length = ipc::kMaxTensorNameBytes + 1;
  expect_invalid("name");
  SetUp();
  entry_.name_length = 0;
  expect_invalid("empty");
}

TEST_F(SubmissionTest, RejectsPartialOverlap) {
  entry_.recv_offset = 1024;
  expect_invalid("overlap");
}

TEST_F(SubmissionTest, AllgatherInPlaceIsThisRanksSlot) {
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kAllgather);
  entry_.count = 256;  // 1 KiB per rank, 2 KiB received
  entry_.recv_offset = 0;
  entry_.send_offset = 1024;
  EXPECT_TRUE(resolve(/*local_rank=*/1).valid());
  expect_invalid("overlaps", /*local_rank=*/0);
}

TEST_F(SubmissionTest, AllgatherReceiveMustHoldEveryRank) {
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kAllgather);
  entry_.count = 512;  // 2 KiB per rank: 4 KiB received from offset 2048 does not fit
  expect_invalid("outside buffer");
}

TEST_F(SubmissionTest, ReduceScatterInPlaceIsThisRanksBlock) {
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kReduceScatter);
  entry_.count = 256;  // 2 KiB sent (a block of 1 KiB per rank), 1 KiB received
  entry_.send_offset = 0;
  entry_.recv_offset = 1024;
  const Submission s = resolve(/*local_rank=*/1);
  ASSERT_TRUE(s.valid()) << s.error;
  EXPECT_EQ(s.send_bytes(2), 2048u);
  EXPECT_EQ(s.recv_bytes(2), 1024u);
  expect_invalid("overlaps the send range", /*local_rank=*/0);
  entry_.recv_offset = 512;  // inside the send range, at no block's start
  expect_invalid("overlaps the send range", /*local_rank=*/1);
}

TEST_F(SubmissionTest, ReduceScatterSendMustHoldEveryRanksBlock) {
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kReduceScatter);
  entry_.count = 512;  // 4 KiB sent from offset 2048 does not fit
  entry_.send_offset = 2048;
  entry_.recv_offset = 0;
  expect_invalid("send range");
}

TEST_F(SubmissionTest, ReduceScatterTakesAnOp) {
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kReduceScatter);
  entry_.count = 256;
  entry_.recv_offset = 2048;
  entry_.op = GRADSYNC_MAX;
  const Submission s = resolve();
  ASSERT_TRUE(s.valid()) << s.error;
  EXPECT_EQ(s.op, GRADSYNC_MAX);
  entry_.op = 9;
  expect_invalid("op");
}

TEST_F(SubmissionTest, AllToAllIsNeverInPlace) {
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kAllToAll);
  entry_.count = 256;  // 2 KiB sent and 2 KiB received
  const Submission s = resolve();
  ASSERT_TRUE(s.valid()) << s.error;
  EXPECT_EQ(s.send_bytes(2), 2048u);
  EXPECT_EQ(s.recv_bytes(2), 2048u);
  entry_.recv_offset = 0;
  expect_invalid("never in place");
  entry_.recv_offset = 1024;
  expect_invalid("never in place", /*local_rank=*/1);
}

TEST_F(SubmissionTest, BarrierNeedsNoBuffers) {
  entry_.collective = static_cast<uint8_t>(ipc::Collective::kBarrier);
  entry_.send_buffer = 42;
  EXPECT_TRUE(resolve().valid());
}

TEST_F(SubmissionTest, GroupedEntryNeedsAGroupSize) {
  entry_.flags = ipc::kFlagGrouped;
  entry_.group_size = 0;
  expect_invalid("group");
}

// A look resolves each buffer id once, whatever order and however many ids it meets; an id not
// registered stays not registered for the look.
TEST(BufferMemo, ResolvesEachIdOnceAndNeverAnotherIdsBuffer) {
  std::vector<std::shared_ptr<HostBuffer>> buffers;
  for (uint8_t b = 0; b < 7; ++b) {
    buffers.push_back(std::make_shared<HostBuffer>());
    buffers.back()->bytes = 100 + b;
  }
  std::vector<int> lookups(buffers.size() + 1, 0);
  BufferMemo memo([&](uint32_t id) -> RegisteredMemory {
    ++lookups[id];
    return id < buffers.size() ? RegisteredMemory(buffers[id]) : RegisteredMemory{};
  });
  for (int round = 0; round < 3; ++round) {
    for (const uint32_t id : {1u, 2u, 1u, 2u, 7u}) {
      const RegisteredMemory memory = memo(id);
      if (id == 7) {
        EXPECT_EQ(memory.mapping, nullptr);
      } else {
        EXPECT_EQ(memory.mapping, buffers[id]);
        EXPECT_EQ(memory.bytes, 100u + id);
      }
    }
  }
  EXPECT_EQ(lookups[1], 1);
  EXPECT_EQ(lookups[2], 1);
  EXPECT_EQ(lookups[7], 1);
  // The answers it gave itself, counted as the cache would have counted them.
  EXPECT_EQ(memo.repeats().hits, 10u);
  EXPECT_EQ(memo.repeats().unregistered, 2u);
  // More ids than it keeps: each still gets its own buffer, and the buffer handed out last
  // stays valid across the next lookup (a submission's send buffer, then its receive buffer).
  for (int round = 0; round < 3; ++round) {
    for (uint32_t id = 0; id < buffers.size(); ++id) {
      const RegisteredMemory& send = memo(id);
      const RegisteredMemory& recv = memo((id + 3) % buffers.size());
      EXPECT_EQ(send.mapping, buffers[id]);
      EXPECT_EQ(recv.mapping, buffers[(id + 3) % buffers.size()]);
    }
  }
}

}  // namespace
}  // namespace gradsync::daemon
