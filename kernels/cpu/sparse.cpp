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

}  // namespace

void carry_and_measure(float* carried, const float* gradient, size_t count, size_t chunk_elements,
                       float* energy) {
  for (size_t begin = 0, c = 0; begin < count; begin += chunk_elements, ++c) {
    energy[c] = static_cast<float>(
        carry_chunk(carried + begin, gradient + begin, std::min(chunk_elements, count - begin)));
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
