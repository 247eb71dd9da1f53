// The top-k codec's kernels (kernels/sparse.h): what a chunk's energy is, which chunks are
// chosen (the same on every node that holds the same energies), and what is carried.
#include "kernels/sparse.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace gradsync::kernels {
namespace {

TEST(Sparse, ChunkEnergyIsEachChunksSumOfSquares) {
  // 3 chunks of 1000, the last one cut to 37; lengths not a multiple of the lanes.
  const size_t chunk = 1000;
  std::vector<float> data(2037);
  for (size_t i = 0; i < data.size(); ++i) data[i] = 0.5f * static_cast<float>(i % 7) - 1.0f;
  std::vector<float> energy(3, -1.0f);
  chunk_energy(data.data(), data.size(), chunk, energy.data());
  for (size_t c = 0; c < 3; ++c) {
    double expected = 0;
    for (size_t i = c * chunk; i < std::min(data.size(), (c + 1) * chunk); ++i) {
      expected += static_cast<double>(data[i]) * data[i];
    }
    EXPECT_NEAR(energy[c], expected, 1e-6 * expected) << "chunk " << c;
  }
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

TEST(Sparse, TakeCarriedAddsAndClears) {
  std::vector<float> data = {1, 2, 3, 4, 5};
  std::vector<float> carried = {0.5f, -2, 0, 1, 10};
  take_carried(data.data(), carried.data(), data.size());
  EXPECT_EQ(data, (std::vector<float>{1.5f, 0, 3, 5, 15}));
  EXPECT_EQ(carried, (std::vector<float>(5, 0.0f)));
}

}  // namespace
}  // namespace gradsync::kernels
