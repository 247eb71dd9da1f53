#include "daemon/node/link_probe.h"

#include "kernels/reduce.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kLatencyRounds = 20;
constexpr int kBandwidthRounds = 3;
constexpr size_t kBandwidthBytes = 1 << 20;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Seconds per byte to reduce two f32 arrays into one, the inter-node step's reduction.
double measure_gamma(Scratch& scratch) {
  const size_t count = kBandwidthBytes / sizeof(float);
  auto* a = reinterpret_cast<float*>(scratch.get(0, kBandwidthBytes));
  auto* b = reinterpret_cast<float*>(scratch.get(1, kBandwidthBytes));
  std::fill(a, a + count, 1.0F);
  std::fill(b, b + count, 2.0F);
  std::vector<double> times;
  for (int round = 0; round < 5; ++round) {
    const void* inputs[] = {a, b};
    void* outputs[] = {a};
    const auto start = Clock::now();
    kernels::reduce_to_all(GRADSYNC_FLOAT32, GRADSYNC_SUM, inputs, 2, outputs, 1, count, false);
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(times) / kBandwidthBytes;
}

}  // namespace

NodeResult probe_links(NodeLinks& links, Scratch& scratch, LinkFigures& figures) {
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  figures.gamma_seconds_per_byte = measure_gamma(scratch);
  if (n < 2) return std::nullopt;
  const uint32_t right = (me + 1) % n;
  const uint32_t left = (me + n - 1) % n;
  uint8_t* out = scratch.get(0, kBandwidthBytes);
  uint8_t* in = scratch.get(1, kBandwidthBytes);
  uint32_t part = 0;
  // One ring step: send to the right, receive from the left, both done.
  auto exchange = [&](size_t bytes, double& seconds) -> NodeResult {
    Flight flight(links, &scratch, {}, "measuring the links between nodes");
    const auto start = Clock::now();
    flight.add(links.receive(links.tag(tags::kProbe, left, 0, part), left, in, bytes));
    flight.add(links.send(right, links.tag(tags::kProbe, me, 0, part), out, bytes));
    ++part;
    auto error = flight.wait_all();
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return error;
  };
  std::vector<double> small;
  std::vector<double> large;
  double seconds = 0;
  for (int round = 0; round < kLatencyRounds; ++round) {
    if (auto error = exchange(8, seconds)) return error;
    small.push_back(seconds);
  }
  for (int round = 0; round < kBandwidthRounds; ++round) {
    if (auto error = exchange(kBandwidthBytes, seconds)) return error;
    large.push_back(seconds);
  }
  figures.alpha_seconds = median(small);
  figures.beta_seconds_per_byte =
      std::max(median(large) - figures.alpha_seconds, 0.0) / kBandwidthBytes;
  return std::nullopt;
}

}  // namespace gradsync::daemon
