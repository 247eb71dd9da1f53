// One rank's side of gradsync-bench: the size sweep and the model step.
#pragma once

#include "tools/bench/options.h"

#include <gradsync/gradsync.hpp>

#include <chrono>
#include <vector>

namespace gradsync::bench {

// Each returns the number of wrong elements this rank saw (0 without --check).
uint64_t run_sweep(const BenchOptions& options, Communicator& comm, const gradsync_options& who);
uint64_t run_model(const BenchOptions& options, Communicator& comm, int rank, int ranks);
// --calibrate: every rank of the job; rank 0 writes the file.
void run_calibration(const BenchOptions& options, Communicator& comm, const gradsync_options& who);

// Element-wise max across the ranks (times), and sum (wrong counts), through gradsync itself.
void max_across_ranks(Communicator& comm, SharedBuffer& scratch, std::vector<double>& values);
uint64_t sum_across_ranks(Communicator& comm, SharedBuffer& scratch, uint64_t value);

double median(std::vector<double> values);

// The measurement every bench mode shares: `warmup` runs of `once`, a barrier, then
// `iterations` timed runs; returns each iteration's time (µs) on the slowest rank.
template <typename Once>
std::vector<double> slowest_rank_times_us(Communicator& comm, SharedBuffer& scratch, int iterations,
                                          int warmup, Once once) {
  for (int i = 0; i < warmup; ++i) once();
  comm.barrier();
  std::vector<double> times(static_cast<size_t>(iterations));
  for (auto& t : times) {
    const auto start = std::chrono::steady_clock::now();
    once();
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  max_across_ranks(comm, scratch, times);
  return times;
}
double percentile(std::vector<double> values, double p);

}  // namespace gradsync::bench
