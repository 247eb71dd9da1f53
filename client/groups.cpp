#include "client/groups.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gradsync::client::groups {
namespace {

// Both groups need every node to hold local_world_size ranks numbered consecutively, as
// torchrun and srun's block distribution number them: node n holds ranks n*L .. n*L+L-1.
int32_t node_index(const gradsync_options& job) {
  using std::to_string;
  const int32_t per_node = job.local_world_size;
  if (per_node < 1 || job.world_size < 1 || job.world_size % per_node != 0) {
    throw std::invalid_argument("a job's groups need as many ranks on every node: world size " +
                                to_string(job.world_size) + " is no multiple of local world size " +
                                to_string(per_node));
  }
  if (job.rank < 0 || job.rank >= job.world_size || job.local_rank != job.rank % per_node) {
    throw std::invalid_argument(
        "a job's groups need each node's ranks numbered consecutively: rank " +
        to_string(job.rank) + " has local rank " + to_string(job.local_rank) + " of " +
        to_string(per_node));
  }
  const int32_t node = job.rank / per_node;
  if (job.node_rank >= 0 && job.node_rank != node) {
    throw std::invalid_argument("rank " + to_string(job.rank) + " is on node " +
                                to_string(job.node_rank) + ", where consecutive numbering puts " +
                                "it on node " + to_string(node));
  }
  const std::string_view list(job.nodes);
  const auto listed = list.empty() ? 1 : 1 + std::count(list.begin(), list.end(), ',');
  if (listed != job.world_size / per_node) {
    throw std::invalid_argument("the job lists " + to_string(listed) + " node(s) but its " +
                                to_string(job.world_size) + " ranks fill " +
                                to_string(job.world_size / per_node));
  }
  return node;
}

void set_job(gradsync_options& group, const gradsync_options& job, const std::string& suffix) {
  const std::string name = std::string(job.job) + suffix;
  if (name.size() >= sizeof(group.job)) {
    throw std::invalid_argument("job name '" + name + "' of a group is longer than " +
                                std::to_string(sizeof(group.job) - 1) +
                                " bytes (shorten the job's)");
  }
  std::memcpy(group.job, name.c_str(), name.size() + 1);
}

}  // namespace

gradsync_options node_group(const gradsync_options& job) {
  node_index(job);
  gradsync_options group = job;
  set_job(group, job, ".node");
  group.rank = job.local_rank;
  group.world_size = job.local_world_size;
  group.nodes[0] = '\0';
  group.node_rank = 0;
  return group;
}

gradsync_options across_nodes_group(const gradsync_options& job) {
  const int32_t node = node_index(job);
  gradsync_options group = job;
  set_job(group, job, ".local" + std::to_string(job.local_rank));
  group.rank = node;
  group.world_size = job.world_size / job.local_world_size;
  group.local_rank = 0;
  group.local_world_size = 1;
  group.node_rank = group.world_size > 1 ? node : 0;
  return group;
}

std::vector<int32_t> ranks_in_job(const gradsync_options& job, const gradsync_options& group) {
  const int32_t per_node = job.local_world_size;
  const int32_t node = node_index(job);
  const std::string_view name(group.job, strnlen(group.job, sizeof(group.job)));
  const gradsync_options own_node = node_group(job);
  const gradsync_options own_across = across_nodes_group(job);
  std::vector<int32_t> ranks;
  if (name == own_node.job && group.world_size == own_node.world_size) {
    for (int32_t r = 0; r < per_node; ++r) ranks.push_back(node * per_node + r);
  } else if (name == own_across.job && group.world_size == own_across.world_size) {
    for (int32_t n = 0; n < own_across.world_size; ++n)
      ranks.push_back(n * per_node + job.local_rank);
  } else {
    throw std::invalid_argument("group '" + std::string(name) + "' of " +
                                std::to_string(group.world_size) + " rank(s) is neither of job '" +
                                job.job + "''s groups for rank " + std::to_string(job.rank) +
                                " ('" + own_node.job + "', '" + own_across.job + "')");
  }
  return ranks;
}

}  // namespace gradsync::client::groups
