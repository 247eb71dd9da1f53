// Point-to-point calls (send, recv) of the backend. The daemon runs collectives of jobs, so each
// pair of a group's ranks that exchange messages gets a 2-rank job of its own, formed the first
// time either of them sends to or receives from the other: "<group job>.p2p.<low>.<high>",
// the lower group rank its rank 0. A message is a broadcast from its sender in that job, named
// by its direction and tag: the daemon matches the n-th submission of a name on one rank with
// the n-th on the other, so each (source, target, tag) keeps its order, messages of different
// tags or directions never block one another, and a receive posted before its send is no error.
// A job of two ranks on one node never touches the network; across nodes it is a job of the
// two nodes' daemons.
#pragma once

#include <gradsync/gradsync.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace gradsync::torch_backend {

// Where a group's ranks run: each group rank's node, by the inter-node address of its daemon
// (all empty for a group on one node).
struct GroupLayout {
  std::vector<std::string> member_addresses;

  bool on_one_node() const {
    return std::all_of(member_addresses.begin(), member_addresses.end(),
                       [](const std::string& address) { return address.empty(); });
  }
};

// The options the pair of `group`'s own rank and `peer` connect to their job with; `group` is
// this rank's options in the group's job. Throws std::invalid_argument where `peer` is not
// another rank of the group or the layout does not describe the group.
gradsync_options pair_options(const gradsync_options& group, const GroupLayout& layout, int peer);

// The pair's job is a part of the group's (gradsync_job_settings.parent_job), its ranks 0 and 1
// the group's `ranks` (low, high): a rank of the group that dies fails every pair holding it,
// even one it never joined, so its peer's calls fail at once. `ranks` must outlive connecting.
using PairRanks = std::array<int32_t, 2>;
PairRanks pair_ranks(int self, int peer);
gradsync_job_settings pair_settings(const gradsync_job_settings& group,
                                    const gradsync_options& group_options, const PairRanks& ranks);

// The pair job's name: "<group job>.p2p.<low>.<high>", the group job's name shortened to a
// prefix and a hash of the whole where that would not fit a job name.
std::string pair_job_name(const std::string& group_job, int low, int high);

// The name of the messages from group rank `source` to `target` with `tag`.
std::string message_name(int source, int target, int tag);
// The name of the blocks an uneven all-to-all of a group on one node sends from `source` to
// `target` (uneven_alltoall.h).
std::string alltoall_block_name(int source, int target);

}  // namespace gradsync::torch_backend
