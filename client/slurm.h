// What srun tells each task of a Slurm job step: the nodes and the task's place among them. The
// library takes a job's layout from it where torchrun's variables and GRADSYNC_NODES are not
// set (gradsync_options_from_env).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradsync::client::slurm {

// A Slurm host list, expanded: "node[01-03,7],gpu5" is node01 node02 node03 node7 gpu5 (ranges
// keep their zero padding; several bracket groups in a name multiply). Throws
// std::invalid_argument naming what is wrong.
std::vector<std::string> expand_hostlist(std::string_view list);

// SLURM_TASKS_PER_NODE, expanded: "2(x3),1" is 2 2 2 1. Throws std::invalid_argument.
std::vector<int32_t> tasks_per_node(std::string_view counts);

// A task's place in its job step, as srun's environment gives it.
struct TaskLayout {
  int32_t rank = 0;                // SLURM_PROCID
  int32_t world_size = 1;          // SLURM_NTASKS
  int32_t local_rank = 0;          // SLURM_LOCALID
  int32_t local_world_size = 1;    // this node's SLURM_TASKS_PER_NODE
  int32_t node = 0;                // SLURM_NODEID
  std::vector<std::string> hosts;  // SLURM_JOB_NODELIST, expanded
  std::string job;                 // slurm.JOBID.STEPID: the same for every task of the step
};
// nullopt outside srun (no SLURM_PROCID or SLURM_JOB_NODELIST); throws std::invalid_argument
// naming a variable that is malformed.
std::optional<TaskLayout> layout_from_env();

// The hosts as a GRADSYNC_NODES list: each resolved to its IPv4 address, with `port`. Throws
// std::runtime_error naming a host that does not resolve.
std::string node_list(const std::vector<std::string>& hosts, uint16_t port);

}  // namespace gradsync::client::slurm
