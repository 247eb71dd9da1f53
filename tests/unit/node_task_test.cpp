// NodeTask: a coroutine resumed by polls. What the engine relies on: a poll resumes the task
// only once what it waits for is ready, says whether it did (a task that works in pieces
// between engine rounds keeps the engine awake), and hands back the task's result.
#include "daemon/links/node_task.h"
#include "daemon/collectives/internode/node_collectives.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

namespace gradsync::daemon {
namespace {

class Gate final : public NodeWait {
 public:
  explicit Gate(const bool& open) : open_(&open) {}
  bool ready() override { return *open_; }
  NodeResult take_result() { return std::nullopt; }

 private:
  const bool* open_;
};

NodeTask pieces(std::vector<int>& done, int count) {
  for (int piece = 0; piece < count; ++piece) {
    done.push_back(piece);
    co_await next_round();
  }
  co_return "all " + std::to_string(count);
}

NodeTask behind(const bool& open, int& resumed) {
  co_await NodeAwait<Gate>{Gate(open)};
  ++resumed;
  co_return std::nullopt;
}

TEST(NodeTask, NextRoundResumesOnTheFollowingPollAndCountsAsWork) {
  std::vector<int> done;
  NodeTask task = pieces(done, 3);
  EXPECT_EQ(done, std::vector<int>{0});  // runs to its first wait as it is made
  EXPECT_FALSE(task.poll());
  EXPECT_TRUE(task.worked());
  EXPECT_EQ(done, (std::vector<int>{0, 1}));
  EXPECT_FALSE(task.poll());
  EXPECT_TRUE(task.poll());
  EXPECT_TRUE(task.worked());
  EXPECT_EQ(done, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(task.result(), "all 3");
  EXPECT_TRUE(task.poll());  // finished: nothing more runs
  EXPECT_FALSE(task.worked());
}

TEST(NodeTask, APollWhileTheWaitIsNotReadyDoesNotResume) {
  bool open = false;
  int resumed = 0;
  NodeTask task = behind(open, resumed);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(task.poll());
    EXPECT_FALSE(task.worked());
  }
  EXPECT_EQ(resumed, 0);
  open = true;
  EXPECT_TRUE(task.poll());
  EXPECT_TRUE(task.worked());
  EXPECT_EQ(resumed, 1);
  EXPECT_FALSE(task.result());
}

// A collective's own copy in pieces: one piece as it starts, one more each poll, the whole
// (a short last piece too) once done, and every poll counted as work.
TEST(NodeTask, CopyBetweenRoundsCopiesAPieceEachRound) {
  const uint64_t bytes = 2 * cost_model::kPipelinePieceBytes + 5;
  std::vector<uint8_t> source(bytes);
  std::iota(source.begin(), source.end(), uint8_t{1});
  std::vector<uint8_t> destination(bytes, 0);
  NodeTask copying =
      node_detail::copy_between_rounds(destination.data(), source.data(), bytes, false);
  auto copied = [&] {
    return static_cast<uint64_t>(
        std::count_if(destination.begin(), destination.end(), [](uint8_t b) { return b != 0; }));
  };
  // iota wraps to 0 every 256 bytes: what a copy of the first n leaves non-zero.
  const auto nonzero = [](uint64_t n) { return n - n / 256; };
  EXPECT_EQ(copied(), nonzero(cost_model::kPipelinePieceBytes));
  EXPECT_FALSE(copying.poll());
  EXPECT_TRUE(copying.worked());
  EXPECT_EQ(copied(), nonzero(2 * cost_model::kPipelinePieceBytes));
  EXPECT_TRUE(copying.poll());
  EXPECT_TRUE(copying.worked());
  EXPECT_EQ(destination, source);
  EXPECT_FALSE(copying.result());
}

}  // namespace
}  // namespace gradsync::daemon
