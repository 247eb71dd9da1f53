#include "tests/integration/topk_scenario.h"

#include "tools/common/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace gradsync::testing {
namespace {

constexpr size_t kChunk = 8192;  // the daemon's kTopKChunkElements

// Two tensors submitted together each step (so they may be fused, which must not change what
// either sends): one of 10 chunks and a cut one, one of 3 whole chunks.
const size_t kCounts[] = {10 * kChunk + 1000, 3 * kChunk};
constexpr int kSteps = 5;

// Every chunk of a tensor has a scale of its own in each step (a permutation of 1..chunks plus
// an irrational fraction, so that neither the scales nor the sums a node holds back over the
// steps come out equal): chunk energies are far apart and the choice is clear. Ranks differ a
// little.
float input(int rank, int step, size_t tensor, size_t i) {
  const size_t chunks = (kCounts[tensor] + kChunk - 1) / kChunk;
  const size_t chunk = i / kChunk;
  const double fraction = std::fmod(
      0.6180339887 * static_cast<double>(chunk + 1) + 0.4142135624 * static_cast<double>(step + 1),
      1.0);
  const double scale =
      1.0 + fraction +
      static_cast<double>((chunk * 5 + static_cast<size_t>(step) * 3 + tensor) % chunks);
  return static_cast<float>(
      scale * (1.0 + 0.01 * static_cast<double>((static_cast<size_t>(rank) * 7 + i) % 13)) *
      ((i % 2 == 0) ? 1.0 : -1.0));
}

int fail(int rank, const char* what, int step, size_t tensor, size_t i, double got,
         double expected) {
  std::fprintf(stderr,
               "rank %d: topk step %d tensor %zu element %zu: %s (got %.9g, expected %.9g)\n", rank,
               step, tensor, i, what, got, expected);
  return 1;
}

// The codec's rules in double, step after step: what each node holds back of each tensor.
class Reference {
 public:
  Reference(int rank, int ranks, int local_ranks, double percent)
      : rank_(rank),
        ranks_(ranks),
        local_ranks_(local_ranks),
        percent_(percent),
        carried_(static_cast<size_t>(ranks / local_ranks)) {
    for (auto& node : carried_) {
      for (const size_t count : kCounts) node.emplace_back(count, 0.0);
    }
  }

  // Checks tensor t of `step` (`got`), and moves the held-back values on; 0 when right.
  int check(int step, gradsync_op op, size_t t, const float* got) {
    const size_t count = kCounts[t];
    const size_t chunks = (count + kChunk - 1) / kChunk;
    // Each node's sum of its ranks' inputs and of what it held back.
    std::vector<std::vector<double>> node_sum(carried_.size(), std::vector<double>(count));
    for (size_t node = 0; node < carried_.size(); ++node) {
      for (size_t i = 0; i < count; ++i) {
        node_sum[node][i] = carried_[node][t][i];
        for (int local = 0; local < local_ranks_; ++local) {
          node_sum[node][i] += input(static_cast<int>(node) * local_ranks_ + local, step, t, i);
        }
      }
    }
    std::vector<double> energy(chunks, 0.0);
    for (const auto& sum : node_sum) {
      for (size_t i = 0; i < count; ++i) energy[i / kChunk] += sum[i] * sum[i];
    }
    const auto keep = static_cast<size_t>(std::ceil(static_cast<double>(chunks) * percent_ / 100));
    const size_t chosen_count = std::clamp<size_t>(keep, 1, chunks);
    std::vector<size_t> order(chunks);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&energy](size_t a, size_t b) { return energy[a] > energy[b]; });
    // The daemon sums energies in float: a near tie could go either way there.
    if (chosen_count < chunks &&
        energy[order[chosen_count - 1]] < energy[order[chosen_count]] * (1 + 1e-4)) {
      std::fprintf(stderr, "rank %d: topk step %d tensor %zu: the test's inputs tie\n", rank_, step,
                   t);
      return 1;
    }
    std::vector<bool> chosen(chunks, false);
    for (size_t c = 0; c < chosen_count; ++c) chosen[order[c]] = true;
    for (size_t i = 0; i < count; ++i) {
      double expected = 0;
      double magnitude = 1;
      if (chosen[i / kChunk]) {
        for (const auto& sum : node_sum) {
          expected += sum[i];
          magnitude += std::abs(sum[i]);
        }
        if (op == GRADSYNC_AVG) expected /= ranks_;
      }
      if (!chosen[i / kChunk] && got[i] != 0) {
        return fail(rank_, "a chunk not chosen is not zero", step, t, i, got[i], 0);
      }
      if (std::abs(got[i] - expected) > 1e-5 * magnitude) {
        return fail(rank_, "wrong", step, t, i, got[i], expected);
      }
    }
    for (size_t node = 0; node < carried_.size(); ++node) {
      for (size_t i = 0; i < count; ++i) {
        carried_[node][t][i] = chosen[i / kChunk] ? 0.0 : node_sum[node][i];
      }
    }
    return 0;
  }

 private:
  int rank_;
  int ranks_;
  int local_ranks_;
  double percent_;
  std::vector<std::vector<std::vector<double>>> carried_;  // by node, tensor, element
};

}  // namespace

int scenario_topk(Communicator& comm, int rank, int ranks, int local_ranks, double percent) {
  size_t total = 0;
  for (const size_t count : kCounts) total += count;
  // Two steps' buffers: the last two steps are submitted together, as by a rank a step ahead,
  // so that each name's second allreduce waits (in the daemon) for what its first held back.
  SharedBuffer buffer = comm.allocate(2 * total * sizeof(float));
  auto* data = static_cast<float*>(buffer.data());
  Reference reference(rank, ranks, local_ranks, percent);
  auto op_of = [](int step) { return step % 2 == 0 ? GRADSYNC_SUM : GRADSYNC_AVG; };
  for (int step = 0; step < kSteps;) {
    const int together = step == kSteps - 2 ? 2 : 1;
    std::vector<gradsync_request> requests;
    for (int s = step; s < step + together; ++s) {
      float* at = data + static_cast<size_t>(s % 2) * total;
      for (size_t t = 0; t < std::size(kCounts); ++t) {
        for (size_t i = 0; i < kCounts[t]; ++i) at[i] = input(rank, s, t, i);
        const std::string name = "topk." + std::to_string(t);
        requests.push_back(
            comm.allreduce(name.c_str(), at, at, kCounts[t], GRADSYNC_FLOAT32, op_of(s)));
        at += kCounts[t];
      }
    }
    for (const gradsync_request request : requests) comm.wait(request);
    for (int s = step; s < step + together; ++s) {
      const float* at = data + static_cast<size_t>(s % 2) * total;
      for (size_t t = 0; t < std::size(kCounts); ++t) {
        if (const int failed = reference.check(s, op_of(s), t, at); failed != 0) return failed;
        at += kCounts[t];
      }
    }
    step += together;
  }
  // The codec is for f32 sums and averages: a maximum, and another dtype, stay exact.
  reference::fill_input(data, kCounts[0], GRADSYNC_FLOAT32, rank, GRADSYNC_MAX, 91);
  comm.wait(comm.allreduce("topk.max", data, data, kCounts[0], GRADSYNC_FLOAT32, GRADSYNC_MAX));
  if (const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, data, kCounts[0],
                                                  GRADSYNC_FLOAT32, GRADSYNC_MAX, ranks, 0, 91);
      wrong != 0) {
    std::fprintf(stderr, "rank %d: topk: f32 max: %zu wrong\n", rank, wrong);
    return 1;
  }
  const size_t doubles = kCounts[0] / 2;
  reference::fill_input(data, doubles, GRADSYNC_FLOAT64, rank, GRADSYNC_SUM, 92);
  comm.wait(comm.allreduce("topk.f64", data, data, doubles, GRADSYNC_FLOAT64, GRADSYNC_SUM));
  if (const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, data, doubles,
                                                  GRADSYNC_FLOAT64, GRADSYNC_SUM, ranks, 0, 92);
      wrong != 0) {
    std::fprintf(stderr, "rank %d: topk: f64 sum: %zu wrong\n", rank, wrong);
    return 1;
  }
  return 0;
}

}  // namespace gradsync::testing
