// The two groups of a hierarchical scheme (DASO's: synchronise within each node every step,
// across nodes every few), derived from a job's options. Each is a job of its own in the
// daemons, as each torch.distributed subgroup is: the node's group is a one-node job and never
// touches the network.
#pragma once

#include <gradsync/gradsync.h>

#include <cstdint>
#include <vector>

namespace gradsync::client::groups {

// The options of the group of this rank's node: its local ranks, job "<job>.node".
// Throws std::invalid_argument naming what in `job` does not fit (see check in groups.cpp).
gradsync_options node_group(const gradsync_options& job);

// The options of the group of the ranks, one per node, that share this rank's local rank:
// job "<job>.local<L>", this node's index as the rank, every node of the job. Throws
// std::invalid_argument as node_group.
gradsync_options across_nodes_group(const gradsync_options& job);

// Each rank of `group`, one of the two above of `job`, as its rank in `job`: the parent ranks
// that make the group a part of the job (gradsync_job_settings.parent_job), so that a rank the
// job loses fails the group at once. Throws std::invalid_argument where `group` is neither.
std::vector<int32_t> ranks_in_job(const gradsync_options& job, const gradsync_options& group);

}  // namespace gradsync::client::groups
