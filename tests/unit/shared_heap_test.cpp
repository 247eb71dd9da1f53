// The heap of shared memory a framework allocates tensors from: thread-safe, refusing what it
// did not allocate, and letting an empty arena go while a holder of it keeps it mapped.
#include "client/shared_heap.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace gradsync::client {
namespace {

constexpr size_t kMiB = 1 << 20;

TEST(SharedHeap, RefusesToFreeWhatItDidNotAllocate) {
  SharedHeap heap;
  auto* block = static_cast<uint8_t*>(heap.allocate(kMiB));
  ASSERT_NE(block, nullptr);
  int outside = 0;
  EXPECT_FALSE(heap.deallocate(&outside));
  EXPECT_FALSE(heap.deallocate(block + 256)) << "inside an allocation, not its start";
  EXPECT_TRUE(heap.deallocate(block));
  EXPECT_FALSE(heap.deallocate(block)) << "freed twice";
}

TEST(SharedHeap, AnEmptyArenaIsLetGoButStaysMappedForItsHolder) {
  SharedHeap heap;
  void* first = heap.allocate(kMiB);
  // Larger than an arena's least size: an arena of its own.
  auto* big = static_cast<uint8_t*>(heap.allocate(80 * kMiB));
  ASSERT_NE(big, nullptr);
  std::shared_ptr<const SharedHeap::Arena> arena = heap.arena_of(big + 79 * kMiB, kMiB);
  ASSERT_NE(arena, nullptr);
  EXPECT_EQ(heap.arena_of(big, 200 * kMiB), nullptr) << "past the arena's end";
  EXPECT_NE(heap.arena_of(first, kMiB), arena);
  std::memset(big, 7, 80 * kMiB);
  EXPECT_EQ(heap.releases(), 0u);
  EXPECT_TRUE(heap.deallocate(big));
  EXPECT_EQ(heap.releases(), 1u);
  EXPECT_TRUE(arena->released());
  EXPECT_EQ(heap.arena_of(big, kMiB), nullptr);
  EXPECT_EQ(big[79 * kMiB], 7) << "the holder's mapping outlives the heap's";
  // The last arena is kept for the next allocation.
  EXPECT_TRUE(heap.deallocate(first));
  EXPECT_EQ(heap.releases(), 1u);
}

// A child the process forks shares the arenas but not the lock: it allocates nothing from the
// heap, and a free of the parent's memory leaves it to the parent, whose heap goes on intact.
TEST(SharedHeap, AForkedChildNeitherAllocatesNorFreesTheParentsMemory) {
  SharedHeap heap;
  auto* block = static_cast<uint8_t*>(heap.allocate(kMiB));
  ASSERT_NE(block, nullptr);
  std::memset(block, 5, kMiB);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int outside = 0;
    const bool refused = heap.allocate(kMiB) == nullptr;
    const bool left_alone = heap.deallocate(block);
    const bool foreign_refused = !heap.deallocate(&outside);
    ::_exit(refused && left_alone && foreign_refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_TRUE(heap.owned_here());
  auto* next = static_cast<uint8_t*>(heap.allocate(kMiB));
  ASSERT_NE(next, nullptr);
  EXPECT_TRUE(next >= block + kMiB || next + kMiB <= block) << "the block is still allocated";
  EXPECT_EQ(block[kMiB - 1], 5);
  EXPECT_TRUE(heap.deallocate(block));
  EXPECT_TRUE(heap.deallocate(next));
}

// Threads allocating, writing and freeing while another looks arenas up, as PyTorch's threads
// and a communicator's do (run under TSan in CI).
TEST(SharedHeap, ThreadsAllocateFreeAndLookUpTogether) {
  SharedHeap heap;
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  std::atomic<bool> done{false};
  std::atomic<int> wrong{0};
  std::thread looker([&] {
    while (!done.load()) {
      int probe = 0;
      if (heap.arena_of(&probe, sizeof(probe)) != nullptr) wrong.fetch_add(1);
      (void)heap.releases();
    }
  });
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      std::vector<std::pair<uint8_t*, size_t>> held;
      for (int round = 0; round < kRounds; ++round) {
        const size_t bytes = 4096 + random() % (3 * kMiB);
        auto* block = static_cast<uint8_t*>(heap.allocate(bytes));
        if (block == nullptr) {
          wrong.fetch_add(1);
          continue;
        }
        std::memset(block, t + 1, bytes);
        if (heap.arena_of(block, bytes) == nullptr) wrong.fetch_add(1);
        held.emplace_back(block, bytes);
        if (held.size() > 4) {
          const auto [oldest, size] = held.front();
          if (oldest[size - 1] != t + 1) wrong.fetch_add(1);  // nobody else wrote it
          if (!heap.deallocate(oldest)) wrong.fetch_add(1);
          held.erase(held.begin());
        }
      }
      for (const auto& [block, size] : held) {
        if (!heap.deallocate(block)) wrong.fetch_add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  done = true;
  looker.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace gradsync::client
