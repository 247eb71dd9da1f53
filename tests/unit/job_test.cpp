#include "daemon/engine/job.h"

#include <gtest/gtest.h>

namespace gradsync::daemon {
namespace {

Submission make(ipc::Collective c, uint64_t count, gradsync_dtype dtype = GRADSYNC_FLOAT32,
                gradsync_op op = GRADSYNC_SUM, int32_t root = 0) {
  Submission s;
  s.name = "layer.weight";
  s.collective = c;
  s.count = count;
  s.dtype = dtype;
  s.op = op;
  s.root = root;
  return s;
}

TEST(FindMismatch, AgreeingRanksPass) {
  std::vector<Submission> ranks = {make(ipc::Collective::kAllreduce, 10),
                                   make(ipc::Collective::kAllreduce, 10)};
  EXPECT_FALSE(find_mismatch(ranks));
}

TEST(FindMismatch, NamesTensorFieldAndRanks) {
  std::vector<Submission> ranks = {make(ipc::Collective::kAllreduce, 10),
                                   make(ipc::Collective::kAllreduce, 10),
                                   make(ipc::Collective::kAllreduce, 12)};
  const auto message = find_mismatch(ranks);
  ASSERT_TRUE(message);
  EXPECT_NE(message->find("layer.weight"), std::string::npos) << *message;
  EXPECT_NE(message->find("count"), std::string::npos) << *message;
  EXPECT_NE(message->find("rank 2 has 12"), std::string::npos) << *message;
}

TEST(FindMismatch, EachFieldIsChecked) {
  auto differs = [](Submission other, const char* what) {
    std::vector<Submission> ranks = {make(other.collective, 10), std::move(other)};
    if (ranks[0].collective == ipc::Collective::kBroadcast) ranks[0].root = 0;
    const auto message = find_mismatch(ranks);
    ASSERT_TRUE(message) << what;
    EXPECT_NE(message->find(what), std::string::npos) << *message;
  };
  differs(make(ipc::Collective::kAllreduce, 10, GRADSYNC_FLOAT64), "dtype");
  differs(make(ipc::Collective::kAllreduce, 10, GRADSYNC_FLOAT32, GRADSYNC_MAX), "op");
  differs(make(ipc::Collective::kBroadcast, 10, GRADSYNC_FLOAT32, GRADSYNC_SUM, 1), "root");
  Submission prioritised = make(ipc::Collective::kAllreduce, 10);
  prioritised.priority = 2;
  differs(prioritised, "priority");
  std::vector<Submission> ranks = {make(ipc::Collective::kAllreduce, 10),
                                   make(ipc::Collective::kAllgather, 10)};
  EXPECT_TRUE(find_mismatch(ranks));
}

TEST(FindMismatch, HostAndDeviceMemoryDoNotMix) {
  std::vector<Submission> ranks = {make(ipc::Collective::kAllreduce, 10),
                                   make(ipc::Collective::kAllreduce, 10)};
  ranks[1].device = 0;
  const auto message = find_mismatch(ranks);
  ASSERT_TRUE(message);
  EXPECT_NE(message->find("rank 0 has host memory, rank 1 has device memory"), std::string::npos)
      << *message;
  // Ranks on different devices agree: each device reduces its share.
  ranks[0].device = 1;
  EXPECT_FALSE(find_mismatch(ranks));
}

}  // namespace
}  // namespace gradsync::daemon
