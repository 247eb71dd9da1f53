#include "ipc/ring.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
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
  // A push reads the consumer's index again once the room it last saw is used up: it never
  // writes outside the ring, and a consumer that corrupts its index loses only its entries.
  for (uint32_t i = 0; i < kCapacity; ++i) ASSERT_TRUE(producer_.try_push(Entry{i, {}}));
  EXPECT_FALSE(producer_.try_push(Entry{99, {}}));
}

TEST_F(RingTest, APartialPushLeavesTheRestOfTheSlot) {
  Entry full{1, {}};
  std::fill(std::begin(full.padding), std::end(full.padding), uint8_t{7});
  ASSERT_TRUE(producer_.try_push(full));
  Entry e{};
  ASSERT_TRUE(consumer_.try_pop(e));
  for (uint32_t i = 1; i < kCapacity; ++i) {  // round the ring back to the first slot
    ASSERT_TRUE(producer_.try_push(Entry{i, {}}));
    ASSERT_TRUE(consumer_.try_pop(e));
  }
  ASSERT_TRUE(producer_.try_push(Entry{42, {}}, sizeof(uint64_t)));
  ASSERT_TRUE(consumer_.try_pop(e));
  EXPECT_EQ(e.value, 42u);
  EXPECT_EQ(e.padding[0], 7u) << "the slot's rest is what the previous lap left there";
}

TEST_F(RingTest, ConsumerSeesEntriesPushedAfterItFoundTheRingEmpty) {
  Entry e{};
  EXPECT_FALSE(consumer_.try_pop(e));
  ASSERT_TRUE(producer_.try_push(Entry{5, {}}));
  EXPECT_EQ(consumer_.available(), 1u);
  ASSERT_TRUE(consumer_.try_pop(e));
  EXPECT_EQ(e.value, 5u);
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
