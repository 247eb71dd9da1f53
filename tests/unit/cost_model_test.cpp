#include "daemon/node/cost_model.h"

#include <gtest/gtest.h>

namespace gradsync::daemon {
namespace {

// About a 25 Gbit/s network with 10 us per message, and a 10 GB/s reduction.
const LinkFigures kLink{10e-6, 1.0 / 3.125e9, 1.0 / 10e9};

TEST(CostModel, RingMatchesItsClosedForm) {
  const uint64_t bytes = 64 << 20;
  const double n = 4;
  const double expected =
      2 * (n - 1) * (kLink.alpha_seconds + bytes / n * kLink.beta_seconds_per_byte) +
      (n - 1) * bytes / n * kLink.gamma_seconds_per_byte;
  EXPECT_DOUBLE_EQ(predict_ring(kLink, 4, bytes), expected);
  EXPECT_EQ(predict_ring(kLink, 1, bytes), 0);
}

TEST(CostModel, HalvingDoublingNeedsLogarithmicallyManySteps) {
  // Small messages: latency dominates, 2 log2(8) = 6 steps against the ring's 14.
  EXPECT_NEAR(predict_halving_doubling(kLink, 8, 8), 6 * kLink.alpha_seconds, 1e-7);
  EXPECT_NEAR(predict_ring(kLink, 8, 8), 14 * kLink.alpha_seconds, 1e-7);
  // A node count that is not a power of two pays two full-size steps more.
  EXPECT_GT(predict_halving_doubling(kLink, 5, 1 << 20),
            predict_halving_doubling(kLink, 4, 1 << 20));
}

TEST(CostModel, ChoosesHalvingDoublingForSmallAndRingForLargeTensors) {
  EXPECT_EQ(choose_allreduce(kLink, 8, 1024), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(choose_allreduce(kLink, 6, 256 << 20), AllreduceAlgorithm::kRing);
  // Two nodes: the same two steps either way; the tie goes to the ring.
  EXPECT_EQ(choose_allreduce(kLink, 2, 1024), AllreduceAlgorithm::kRing);
  EXPECT_EQ(choose_allreduce(LinkFigures{}, 8, 1024), AllreduceAlgorithm::kRing);
}

TEST(CostModel, FusesTensorsWhoseMessagesCostMoreThanTheirCopies) {
  // Two nodes: an allreduce of its own costs 2 alpha in messages; fused, a tensor costs a copy
  // in and a copy out, 2 gamma per byte.
  const double expected = 2 * kLink.alpha_seconds / (2 * kLink.gamma_seconds_per_byte);
  EXPECT_NEAR(static_cast<double>(fusion_cutoff_bytes(kLink, 2)), expected, 1.0);
  // More nodes, more messages per allreduce (6 alpha with halving-doubling on 8): more to save.
  EXPECT_NEAR(static_cast<double>(fusion_cutoff_bytes(kLink, 8)), 3 * expected, 3.0);
  // Nothing measured: fuse everything (the fusion threshold still bounds a batch).
  EXPECT_EQ(fusion_cutoff_bytes(LinkFigures{}, 4), UINT64_MAX);
}

TEST(CostModel, ParsesAlgorithmNames) {
  EXPECT_EQ(parse_algorithm("ring"), AllreduceAlgorithm::kRing);
  EXPECT_EQ(parse_algorithm("rhd"), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(parse_algorithm("auto"), std::nullopt);
  EXPECT_STREQ(algorithm_name(AllreduceAlgorithm::kHalvingDoubling), "rhd");
}

}  // namespace
}  // namespace gradsync::daemon
