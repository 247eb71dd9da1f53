#include "kernels/sparse.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

namespace gradsync::kernels {

namespace {

// carried[i] += gradient[i] over [0, count), and the sum of squares of the results: eight float
// lanes side by side (which the compiler turns into vector registers without reordering anything),
// each lane spilled into double every few thousand elements, so that a long chunk's rounding error
// stays that of a short one.
double carry_chunk(float* __restrict carried, const float* __restrict gradient, size_t count) {
  constexpr size_t kLanes = 8;
  constexpr size_t kSpill = 4096;  // elements per lane between spills
  double total = 0;
  size_t i = 0;
  while (i + kLanes <= count) {
    std::array<float, kLanes> lanes{};
    const size_t stop = std::min(count - (count - i) % kLanes, i + kLanes * kSpill);
    for (; i < stop; i += kLanes) {
      for (size_t l = 0; l < kLanes; ++l) {
        const float value = carried[i + l] + gradient[i + l];
        carried[i + l] = value;
        lanes[l] += value * value;
      }
    }
    for (const float lane : lanes) total += lane;
  }
  for (; i < count; ++i) {
    carried[i] += gradient[i];
    total += static_cast<double>(carried[i]) * carried[i];
  }
  return total;
}

void add_into(float* __restrict carried, const float* __restrict gradient, size_t count) {
  for (size_t i = 0; i < count; ++i) carried[i] += gradient[i];
}

}  // namespace

void carry_and_measure(float* carried, std::span<const float* const> gradients, size_t count,
                       size_t chunk_elements, float* energy) {
  // Several gradients (a node's local ranks) are added a block at a time, the block staying in
  // L1 between them, so that the held-back values are read and written once.
  constexpr size_t kBlock = 2048;
  const size_t n = gradients.size();
  for (size_t begin = 0, c = 0; begin < count; begin += chunk_elements, ++c) {
    const size_t end = std::min(count, begin + chunk_elements);
    double total = 0;
    for (size_t block = begin; block < end; block += kBlock) {
      const size_t elements = std::min(kBlock, end - block);
      for (size_t g = 0; g + 1 < n; ++g) add_into(carried + block, gradients[g] + block, elements);
      total += carry_chunk(carried + block, gradients[n - 1] + block, elements);
    }
    energy[c] = static_cast<float>(total);
  }
}

void choose_chunks(std::span<const float> energy, std::span<uint32_t> chosen,
                   std::span<uint32_t> order) {
  const size_t k = std::min(chosen.size(), energy.size());
  std::iota(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(energy.size()), 0u);
  auto key = [&energy](uint32_t c) {
    const float e = energy[c];
    return std::isnan(e) ? INFINITY : e;
  };
  // First the larger energy, then the lower index: a total order, the same on every node.
  auto before = [&key](uint32_t a, uint32_t b) {
    const float ka = key(a);
    const float kb = key(b);
    return ka > kb || (ka == kb && a < b);
  };
  const auto first = order.begin();
  const auto kth = first + static_cast<std::ptrdiff_t>(k);
  std::nth_element(first, kth, first + static_cast<std::ptrdiff_t>(energy.size()), before);
  std::copy(first, kth, chosen.begin());
  std::sort(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(k));
}

}  // namespace gradsync::kernels
