#include "daemon/node/link_probe.h"

#include "kernels/reduce.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kLatencyRounds = 20;
// Large rounds that are not timed, before the timed ones: a link shaped by a token bucket (tc
// tbf, a cloud instance's burst allowance) lets its first megabyte or so through at the
// sender's speed, and the fastest round would be that burst, not the link (1.5 GB/s measured
// on a 1 Gbit/s link with tbf's burst of 1 MB). Back-to-back rounds leave the bucket no time to
// fill again.
constexpr uint32_t kWarmUpRounds = 2;
constexpr uint32_t kBandwidthRounds = 6;
constexpr size_t kBandwidthBytes = 1 << 20;

double fastest(const std::vector<double>& seconds) {
  return *std::min_element(seconds.begin(), seconds.end());
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
  return fastest(times) / kBandwidthBytes;
}

}  // namespace

cost_model::LinkFigures link_figures_from_rounds(const std::vector<double>& small_seconds,
                                                 const std::vector<double>& large_seconds,
                                                 size_t large_bytes) {
  // The fastest round, not the median: a job forms while its ranks are busy setting up (a
  // rank that fills its gradient buffers shares the daemon's core), and a preempted round
  // only ever takes longer. Medians taken then were 10x off (α 221 µs, β 0.1 GB/s on a link
  // that moves 2 GB/s), and every choice made from the figures with them.
  cost_model::LinkFigures figures;
  if (small_seconds.empty() || large_seconds.empty() || large_bytes == 0) return figures;
  figures.alpha_seconds = fastest(small_seconds);
  figures.beta_seconds_per_byte = std::max(fastest(large_seconds) - figures.alpha_seconds, 0.0) /
                                  static_cast<double>(large_bytes);
  return figures;
}

NodeTask probe_links(NodeLinks& links, Scratch& scratch, cost_model::LinkFigures& figures) {
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  figures.gamma_seconds_per_byte = measure_gamma(scratch);
  if (n < 2) co_return std::nullopt;
  const uint32_t right = (me + 1) % n;
  const uint32_t left = (me + n - 1) % n;
  uint8_t* out = scratch.get(0, kBandwidthBytes);
  uint8_t* in = scratch.get(1, kBandwidthBytes);
  std::vector<double> small;
  std::vector<double> large;
  const uint32_t rounds = kLatencyRounds + kWarmUpRounds + kBandwidthRounds;
  for (uint32_t round = 0; round < rounds; ++round) {
    // One ring step: send to the right, receive from the left, both done.
    const bool latency = round < kLatencyRounds;
    const bool timed = latency || round >= kLatencyRounds + kWarmUpRounds;
    const size_t bytes = latency ? 8 : kBandwidthBytes;
    Flight flight(links, &scratch, {}, "measuring the links between nodes");
    const auto start = Clock::now();
    flight.add(links.receive(links.tag(tags::kProbe, left, 0, round), left, in, bytes));
    flight.add(links.send(right, links.tag(tags::kProbe, me, 0, round), out, bytes));
    if (auto error = co_await flight.wait_all()) co_return error;
    if (timed) {
      (latency ? small : large)
          .push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  const cost_model::LinkFigures wire = link_figures_from_rounds(small, large, kBandwidthBytes);
  figures.alpha_seconds = wire.alpha_seconds;
  figures.beta_seconds_per_byte = wire.beta_seconds_per_byte;
  co_return std::nullopt;
}

}  // namespace gradsync::daemon
