#include "tools/bench/runner.h"

#include <algorithm>
#include <cstring>

namespace gradsync::bench {

void max_across_ranks(Communicator& comm, SharedBuffer& scratch, std::vector<double>& values) {
  auto* data = scratch.as<double>();
  std::memcpy(data, values.data(), values.size() * sizeof(double));
  comm.wait(comm.allreduce("bench.max", data, data, values.size(), GRADSYNC_FLOAT64, GRADSYNC_MAX));
  std::memcpy(values.data(), data, values.size() * sizeof(double));
}

uint64_t sum_across_ranks(Communicator& comm, SharedBuffer& scratch, uint64_t value) {
  auto* data = scratch.as<int64_t>();
  data[0] = static_cast<int64_t>(value);
  comm.wait(comm.allreduce("bench.sum", data, data, 1, GRADSYNC_INT64, GRADSYNC_SUM));
  return static_cast<uint64_t>(data[0]);
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double position = p * static_cast<double>(values.size() - 1);
  const auto lower = static_cast<size_t>(position);
  const size_t upper = std::min(lower + 1, values.size() - 1);
  const double fraction = position - static_cast<double>(lower);
  return values[lower] * (1 - fraction) + values[upper] * fraction;
}

double median(std::vector<double> values) {
  return percentile(std::move(values), 0.5);
}

}  // namespace gradsync::bench
