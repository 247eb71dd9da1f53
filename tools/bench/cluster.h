// gradsync-bench --cluster N (see cluster.cpp).
#pragma once

#include "tools/bench/options.h"

namespace gradsync::bench {

// Runs the benchmark on N namespace nodes, -np ranks each; returns the worst exit status.
int launch_cluster(const BenchOptions& options);

}  // namespace gradsync::bench
