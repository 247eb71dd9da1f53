// gradsync-test-rank's scenario for the top-k wire codec (GRADSYNC_WIRE_CODEC=topk:PERCENT).
#pragma once

#include <gradsync/gradsync.hpp>

namespace gradsync::testing {

// Steps of a training-shaped loop through the codec, every rank's results checked against a
// reference that runs the codec's rules (daemon/collectives/internode/node_topk_allreduce.cpp) in
// double: per tensor, the chunks with the most energy summed over the nodes, zeros elsewhere, what
// a node held back added to its next step. Ranks are laid out node by node, `local_ranks` each.
// Returns 0 when every check passed.
int scenario_topk(Communicator& comm, int rank, int ranks, int local_ranks, double percent);

}  // namespace gradsync::testing
