// The top-k codec's kernels (kernels/sparse.h): what is carried, what a chunk's energy is, and
// which chunks are chosen (the same on every node that holds the same energies).
#include "kernels/sparse.h"
#include "daemon/collectives/internode/residuals.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace gradsync::kernels {
namespace {

TEST(Sparse, CarryAddsTheGradientAndMeasuresEachChunk) {
  // 3 chunks of 1000, the last one cut to 37; lengths not a multiple of the lanes.
  const size_t chunk = 1000;
  std::vector<float> gradient(2037);
  std::vector<float> carried(gradient.size());
  for (size_t i = 0; i < gradient.size(); ++i) {
    gradient[i] = 0.5f * static_cast<float>(i % 7) - 1.0f;
    carried[i] = 0.25f * static_cast<float>(i % 3);
  }
  std::vector<float> sum(gradient.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = carried[i] + gradient[i];
  std::vector<float> energy(3, -1.0f);
  const float* gradients[] = {gradient.data()};
  carry_and_measure(carried.data(), gradients, gradient.size(), chunk, energy.data());
  EXPECT_EQ(carried, sum);
  for (size_t c = 0; c < 3; ++c) {
    double expected = 0;
    for (size_t i = c * chunk; i < std::min(sum.size(), (c + 1) * chunk); ++i) {
      expected += static_cast<double>(sum[i]) * sum[i];
    }
    EXPECT_NEAR(energy[c], expected, 1e-6 * expected) << "chunk " << c;
  }
}

TEST(Sparse, CarryAddsEveryLocalRanksGradient) {
  // Chunks longer than the kernel's block, three gradients.
  const size_t count = 5000;
  const size_t chunk = 4500;
  std::vector<std::vector<float>> gradient(3, std::vector<float>(count));
  std::vector<float> carried(count);
  std::vector<double> sum(count);
  for (size_t i = 0; i < count; ++i) {
    carried[i] = static_cast<float>(i % 5) - 2.0f;
    sum[i] = carried[i];
    for (size_t g = 0; g < 3; ++g) {
      gradient[g][i] = 0.25f * static_cast<float>((i + g) % 9);
      sum[i] += gradient[g][i];
    }
  }
  const float* gradients[] = {gradient[0].data(), gradient[1].data(), gradient[2].data()};
  std::vector<float> energy(2);
  carry_and_measure(carried.data(), gradients, count, chunk, energy.data());
  std::vector<double> expected(2, 0.0);
  for (size_t i = 0; i < count; ++i) {
    EXPECT_EQ(carried[i], static_cast<float>(sum[i])) << i;  // small integers over 4: exact
    expected[i / chunk] += sum[i] * sum[i];
  }
  EXPECT_NEAR(energy[0], expected[0], 1e-6 * expected[0]);
  EXPECT_NEAR(energy[1], expected[1], 1e-6 * expected[1]);
}

std::vector<uint32_t> choose(const std::vector<float>& energy, size_t k) {
  std::vector<uint32_t> chosen(k);
  std::vector<uint32_t> order(energy.size());
  choose_chunks(energy, chosen, order);
  return chosen;
}

TEST(Sparse, ChoosesTheChunksWithTheMostEnergyInAscendingOrder) {
  const std::vector<float> energy = {5, 1, 9, 3, 7, 0, 8};
  EXPECT_EQ(choose(energy, 3), (std::vector<uint32_t>{2, 4, 6}));
  EXPECT_EQ(choose(energy, 1), (std::vector<uint32_t>{2}));
  EXPECT_EQ(choose(energy, 7), (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(choose(energy, 0), (std::vector<uint32_t>{}));
}

TEST(Sparse, TiesGoToTheLowerIndexAndNaNCountsAsTheMost) {
  EXPECT_EQ(choose({2, 4, 4, 4, 1}, 2), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(choose({0, 0, 0, 0}, 2), (std::vector<uint32_t>{0, 1}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(choose({3, nan, 5, 1}, 1), (std::vector<uint32_t>{1}));
  EXPECT_EQ(choose({inf, 1, nan, 2}, 2), (std::vector<uint32_t>{0, 2}));
}

}  // namespace
}  // namespace gradsync::kernels

namespace gradsync::daemon {
namespace {

TEST(Residuals, HoldsWhatATensorKeptUntilItsNextAllreduce) {
  Residuals residuals;
  const std::string a = "a";
  const std::string* names[] = {&a};
  EXPECT_TRUE(residuals.available(names));
  std::vector<float> values = residuals.take(a, 4);
  EXPECT_EQ(values, (std::vector<float>(4, 0.0f)));  // new: nothing held back yet
  EXPECT_FALSE(residuals.available(names));          // the next step's allreduce waits
  values = {1, 2, 3, 4};
  residuals.give_back(a, std::move(values));
  EXPECT_TRUE(residuals.available(names));
  EXPECT_EQ(residuals.take(a, 4), (std::vector<float>{1, 2, 3, 4}));
  residuals.give_back(a, {1, 2, 3, 4});
  EXPECT_EQ(residuals.bytes(), 16U);
  // A tensor whose size changed starts afresh.
  EXPECT_EQ(residuals.take(a, 2), (std::vector<float>(2, 0.0f)));
  residuals.give_back(a, {0, 0});
  EXPECT_EQ(residuals.bytes(), 8U);
}

TEST(Residuals, DropsTheLeastRecentlyUsedNamePastItsBound) {
  Residuals residuals(2);
  for (const char* name : {"a", "b"}) residuals.give_back(name, residuals.take(name, 1));
  residuals.give_back("a", residuals.take("a", 1));  // b is now the least recent
  std::vector<float> c = residuals.take("c", 1);
  c[0] = 5;
  residuals.give_back("c", std::move(c));
  EXPECT_EQ(residuals.tensors(), 2U);
  EXPECT_EQ(residuals.evicted(), 1U);
  EXPECT_EQ(residuals.bytes(), 8U);
  EXPECT_EQ(residuals.take("c", 1), (std::vector<float>{5}));  // kept
  residuals.give_back("c", {5});
  // One taken out is never dropped: a, out while d and e pass (both used after it), stays;
  // c, then d go.
  std::vector<float> held = residuals.take("a", 1);
  residuals.give_back("d", residuals.take("d", 1));
  residuals.give_back("e", residuals.take("e", 1));
  EXPECT_EQ(residuals.evicted(), 3U);
  held[0] = 7;
  residuals.give_back("a", std::move(held));
  EXPECT_EQ(residuals.take("a", 1), (std::vector<float>{7}));
  residuals.give_back("a", {7});
  EXPECT_EQ(residuals.tensors(), 2U);
}

}  // namespace
}  // namespace gradsync::daemon
