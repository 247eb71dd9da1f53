// Scratch: the staging memory a job's collectives across nodes hold. Each slot keeps the most
// it was asked for, and a slot unused since a point in time is freed and allocated again when
// asked for (scratch_unused_seconds).
#include "daemon/links/links.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

TEST(Scratch, EachSlotKeepsTheMostItWasAskedFor) {
  Scratch scratch;
  uint8_t* first = scratch.get(0, 1000);
  std::memset(first, 1, 1000);
  EXPECT_EQ(scratch.get(0, 10), first) << "a smaller request reuses the slot";
  scratch.get(2, 500);
  EXPECT_EQ(scratch.bytes(), 1500u);
  scratch.get(0, 4000);
  EXPECT_EQ(scratch.bytes(), 4500u) << "a larger request replaces the slot's memory";
}

TEST(Scratch, SlotsUnusedSinceThenAreFreedAndAllocatedAgainWhenAskedFor) {
  Scratch scratch;
  scratch.get(0, 1 << 20);
  // Apart, so that the clock tells the requests from `between` whatever its resolution.
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const Clock::time_point between = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  scratch.get(1, 1 << 10);
  // Both were asked for since a moment before the first: nothing goes.
  EXPECT_EQ(scratch.release_unused(between - std::chrono::seconds(1)), 0u);
  EXPECT_EQ(scratch.bytes(), (1u << 20) + (1u << 10));
  // Slot 0 was last asked for before `between`, slot 1 since: slot 0 goes.
  EXPECT_EQ(scratch.release_unused(between), 1u << 20);
  EXPECT_EQ(scratch.bytes(), 1u << 10);
  // Asked for again, it is there again, whole.
  uint8_t* again = scratch.get(0, 1 << 20);
  std::memset(again, 2, 1 << 20);
  EXPECT_EQ(scratch.bytes(), (1u << 20) + (1u << 10));
  // Everything unused since later than every request goes.
  EXPECT_EQ(scratch.release_unused(Clock::now() + std::chrono::seconds(1)),
            (1u << 20) + (1u << 10));
  EXPECT_EQ(scratch.bytes(), 0u);
}

TEST(Scratch, AbandonedMemoryOutlivesTheScratch) {
  auto scratch = std::make_unique<Scratch>();
  uint8_t* data = scratch->get(0, 64);
  scratch->get(3, 64);
  const auto memory = scratch->abandon();
  EXPECT_EQ(memory.size(), 2u) << "only the slots that hold memory";
  EXPECT_EQ(scratch->bytes(), 0u);
  scratch.reset();
  std::memset(data, 3, 64);  // still owned by `memory` (AddressSanitizer would say otherwise)
}

}  // namespace
}  // namespace gradsync::daemon
