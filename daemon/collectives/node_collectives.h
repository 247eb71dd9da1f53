// Collectives across node daemons, one algorithm per file. Each runs one ready collective of a
// multi-node job: the local ranks' buffers on this node, the other nodes over NodeLinks, and
// returns an error message when a peer fails (the caller then fails the job).
//
// Allreduces accumulate in local rank 0's receive buffer (the reduction kernels allow outputs
// to alias inputs), so the local reduce, the network reduce and the result share one pass
// and no staging copy; the other local ranks get a copy of each finished slice.
#pragma once

#include "daemon/job.h"
#include "daemon/node/links.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::daemon {

// What a collective across nodes runs with.
struct NodeStep {
  NodeLinks& links;
  Scratch& scratch;
  uint32_t sequence;  // the collective's place in the job's agreed order
  int32_t world_size;
};

using NodeResult = std::optional<std::string>;  // an error, or nothing

NodeResult node_ring_allreduce(NodeStep& step, const ReadyCollective& collective);
NodeResult node_halving_doubling_allreduce(NodeStep& step, const ReadyCollective& collective);
NodeResult node_broadcast(NodeStep& step, const ReadyCollective& collective);
NodeResult node_allgather(NodeStep& step, const ReadyCollective& collective);

// Shared by the algorithms.
namespace node_detail {

// Everything of the ranks' that UCX may touch: handed to the mesh when a collective fails.
std::vector<std::shared_ptr<const void>> rank_memory(const ReadyCollective& collective);

// work[begin, end) = op over the local ranks' inputs (and `extra`, received from a peer).
void reduce_into(const ReadyCollective& collective, gradsync_op op, uint8_t* work, uint64_t begin,
                 uint64_t end, const uint8_t* extra);

// Copies work[begin, end) to the receive buffers of local ranks 1..K-1.
void copy_to_other_ranks(const ReadyCollective& collective, const uint8_t* work, uint64_t begin,
                         uint64_t end);

// The op the network runs: an average is a sum divided once at the end.
inline gradsync_op network_op(gradsync_op op) {
  return op == GRADSYNC_AVG ? GRADSYNC_SUM : op;
}

}  // namespace node_detail
}  // namespace gradsync::daemon
