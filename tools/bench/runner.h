// One rank's side of gradsync-bench: the size sweep and the model step.
#pragma once

#include "tools/bench/options.h"

#include <gradsync/gradsync.hpp>

namespace gradsync::bench {

// Each returns the number of wrong elements this rank saw (0 without --check).
uint64_t run_sweep(const BenchOptions& options, Communicator& comm, int rank, int ranks);
uint64_t run_model(const BenchOptions& options, Communicator& comm, int rank, int ranks);
// --calibrate: every rank of the job; rank 0 writes the file.
void run_calibration(const BenchOptions& options, Communicator& comm, const gradsync_options& who);

// Element-wise max across the ranks (times), and sum (wrong counts), through gradsync itself.
void max_across_ranks(Communicator& comm, SharedBuffer& scratch, std::vector<double>& values);
uint64_t sum_across_ranks(Communicator& comm, SharedBuffer& scratch, uint64_t value);

double median(std::vector<double> values);
double percentile(std::vector<double> values, double p);

}  // namespace gradsync::bench
