// gradsync-test-rank's scenarios for jobs that are parts of another
// (gradsync_job_settings.parent_job): subgroups and pairs of a job's ranks.
#pragma once

#include <gradsync/gradsync.h>

namespace gradsync::testing {

// Three ranks of one job (`job`'s options). Rank 1 dies (its connections end without a
// goodbye) after a barrier; the others then check, each within a bound:
//  - a part holding ranks 0 and 2 only runs an allreduce, right;
//  - a part of ranks 0 and 1, formed after the loss by rank 0 alone, fails naming it;
//  - a subgroup of all three ranks, formed by 0 and 2 after the loss, fails; and a part of
//    that subgroup holding its rank 1, formed by rank 0, fails too (the loss passed down).
// Rank 1's exit status is 0; the others' 0 when every check passed.
int scenario_parts_rank_lost(const gradsync_options& job);

// Three ranks of a job across two nodes, ranks 0 and 1 on node 0, rank 2 on node 1. Rank 1
// dies after a barrier; rank 2 then forms a part of ranks 1 and 2 across the nodes, which
// fails within the bound, node 0 having told node 1 of the loss.
int scenario_parts_rank_lost_across_nodes(const gradsync_options& job);

// Four ranks of a job across two nodes, two a node, each connecting its node's group and its
// group across nodes as parts of the job (gradsync_job_settings_for_group). Rank 1 dies after
// a barrier, before it joined either: the groups holding it (node 0's, and local rank 1's
// across nodes) fail within the bound naming it; the other two each run an allreduce, right.
// Rank 0 also checks that a group that is not the job's, a struct too old for a parent and too
// few ranks' room are refused as invalid arguments.
int scenario_groups_rank_lost(const gradsync_options& job);

// Two ranks of one job, and a part holding both. A rank that leaves the job with a goodbye
// does not fail the part: both go on running allreduces in it. A rank that names other ranks
// in the parent than the part's first rank is refused (GRADSYNC_ERR_MISMATCH), and a parent
// without its ranks is an invalid argument.
int scenario_parts_rank_left(const gradsync_options& job);

}  // namespace gradsync::testing
