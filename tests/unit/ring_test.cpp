#include "ipc/ring.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace gradsync::ipc {
namespace {

struct Entry {
  uint64_t value;
  uint8_t padding[56];
};

class RingTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kCapacity = 8;
  void SetUp() override {
    storage_.resize(RingShared<Entry>::bytes_for(kCapacity) / sizeof(uint64_t) + 8);
    shared_ = new (storage_.data()) RingShared<Entry>{};
    producer_ = RingProducer<Entry>(shared_, kCapacity);
    consumer_ = RingConsumer<Entry>(shared_, kCapacity);
  }
  std::vector<uint64_t> storage_;
  RingShared<Entry>* shared_ = nullptr;
  RingProducer<Entry> producer_;
  RingConsumer<Entry> consumer_;
};

TEST_F(RingTest, DeliversInOrderAcrossWrapAround) {
  uint64_t next_in = 0;
  uint64_t next_out = 0;
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(producer_.try_push(Entry{next_in++, {}}));
    Entry e{};
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(consumer_.try_pop(e));
      EXPECT_EQ(e.value, next_out++);
    }
    EXPECT_FALSE(consumer_.try_pop(e));
  }
}

TEST_F(RingTest, RefusesWhenFullAndEmpty) {
  Entry e{};
  EXPECT_FALSE(consumer_.try_pop(e));
  for (uint32_t i = 0; i < kCapacity; ++i) ASSERT_TRUE(producer_.try_push(Entry{i, {}}));
  EXPECT_FALSE(producer_.try_push(Entry{99, {}}));
  EXPECT_EQ(producer_.free_slots(), 0u);
  ASSERT_TRUE(consumer_.try_pop(e));
  EXPECT_EQ(e.value, 0u);
  EXPECT_TRUE(producer_.try_push(Entry{99, {}}));
}

TEST_F(RingTest, CorruptProducerIndexLooksEmpty) {
  // A hostile producer publishes an index far ahead: the consumer must not read past the ring.
  shared_->produced.store(1'000'000);
  Entry e{};
  EXPECT_EQ(consumer_.available(), 0u);
  EXPECT_FALSE(consumer_.try_pop(e));
}

TEST_F(RingTest, CorruptConsumerIndexLooksFull) {
  shared_->consumed.store(12345);  // ahead of anything produced
  EXPECT_EQ(producer_.free_slots(), 0u);
  EXPECT_FALSE(producer_.try_push(Entry{1, {}}));
}

TEST_F(RingTest, ReattachedSidesResumeFromPublishedIndices) {
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(producer_.try_push(Entry{i, {}}));
  RingConsumer<Entry> again(shared_, kCapacity);
  Entry e{};
  ASSERT_TRUE(again.try_pop(e));
  EXPECT_EQ(e.value, 0u);
}

}  // namespace
}  // namespace gradsync::ipc
