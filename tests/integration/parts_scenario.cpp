#include "tests/integration/parts_scenario.h"

#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::testing {
namespace {

// How long a part may take to fail once the rank it holds is gone: the engine fails it as the
// rank's departure or the part's arrival is handled, so anything near this bound is a hang.
constexpr std::chrono::seconds kFailureBound{10};

// A single-node job named `name`, of which this process is rank `rank` of `ranks`, a part of
// `parent` holding its ranks `parent_ranks` (kept alive by the caller while connecting).
struct Part {
  gradsync_options options;
  gradsync_job_settings settings;
};

// With `one_per_node`, a part across the parent's nodes, each of its ranks on a node of its own
// (the parent's node list, rank r on node r).
Part part_of(const gradsync_options& parent, const std::string& name, int rank,
             const std::vector<int32_t>& parent_ranks, bool one_per_node = false) {
  Part part{parent, gradsync_job_settings{}};
  std::snprintf(part.options.job, sizeof(part.options.job), "%s", name.c_str());
  part.options.rank = rank;
  part.options.world_size = static_cast<int32_t>(parent_ranks.size());
  part.options.local_rank = one_per_node ? 0 : rank;
  part.options.local_world_size = one_per_node ? 1 : part.options.world_size;
  if (one_per_node) {
    part.options.node_rank = rank;
  } else {
    part.options.nodes[0] = '\0';
  }
  part.settings.struct_bytes = sizeof(part.settings);
  std::snprintf(part.settings.parent_job, sizeof(part.settings.parent_job), "%s", parent.job);
  part.settings.parent_ranks = parent_ranks.data();
  return part;
}

// Submits a collective and waits for it up to the bound: true once it completed.
using Waited = std::function<bool(std::chrono::milliseconds)>;

// Runs `call`: "" when it failed as a lost rank makes it fail (GRADSYNC_ERR_PEER_FAILED, naming
// `lost`, within the bound), else what happened.
std::string expect_lost(const std::string& what, const std::string& lost, const Waited& call) {
  const auto start = std::chrono::steady_clock::now();
  try {
    if (!call(kFailureBound)) return what + ": still waiting after the bound";
    return what + ": completed although a rank it holds is gone";
  } catch (const Error& error) {
    const std::string message = error.what();
    if (error.code() != GRADSYNC_ERR_PEER_FAILED || message.find(lost) == std::string::npos) {
      return what + ": failed otherwise: " + message;
    }
    if (std::chrono::steady_clock::now() - start > kFailureBound) {
      return what + ": failed after the bound";
    }
    return "";
  }
}

float sum_of(Communicator& comm, const char* name, float value) {
  SharedBuffer buffer = comm.allocate(sizeof(float));
  auto* data = static_cast<float*>(buffer.data());
  *data = value;
  comm.wait(comm.allreduce(name, data, data, 1, GRADSYNC_FLOAT32, GRADSYNC_SUM));
  return *data;
}

// A collective of `comm` submitted and waited for up to a bound, for expect_lost: a broadcast
// from `root` of the 4 floats in `buffer`, or an allreduce of its first float.
Waited broadcast_from(Communicator& comm, SharedBuffer& buffer, int root) {
  return [&comm, &buffer, root](std::chrono::milliseconds bound) {
    return comm.wait_for(
        comm.broadcast("from", buffer.data(), buffer.data(), 4, GRADSYNC_FLOAT32, root), bound);
  };
}
Waited sum_in(Communicator& comm, SharedBuffer& buffer) {
  return [&comm, &buffer](std::chrono::milliseconds bound) {
    return comm.wait_for(
        comm.allreduce("sum", buffer.data(), buffer.data(), 1, GRADSYNC_FLOAT32, GRADSYNC_SUM),
        bound);
  };
}

// This rank's place in the whole job `job` once rank 1 has died (its connections ending without
// a goodbye, after a barrier) and the whole job failed naming it, which every other rank checks
// into `problems`: from then on the loss is known. Rank 1 never returns.
Communicator whole_job_without_rank_1(const gradsync_options& job,
                                      std::vector<std::string>& problems) {
  Communicator whole(job);
  whole.barrier();
  if (job.rank == 1) std::_Exit(0);
  {
    SharedBuffer one = whole.allocate(sizeof(float));
    problems.push_back(expect_lost("the whole job", "local rank 1 (pid", sum_in(whole, one)));
  }
  return whole;
}

int report(int rank, const std::vector<std::string>& problems) {
  int status = 0;
  for (const std::string& problem : problems) {
    if (problem.empty()) continue;
    std::fprintf(stderr, "rank %d: %s\n", rank, problem.c_str());
    status = 1;
  }
  return status;
}

}  // namespace

int scenario_parts_rank_lost(const gradsync_options& job) {
  const int rank = job.rank;
  const std::string name = job.job;
  std::vector<std::string> problems;
  const Communicator whole = whole_job_without_rank_1(job, problems);

  // A part without rank 1 runs on.
  const std::vector<int32_t> even_ranks = {0, 2};
  const Part even = part_of(job, name + ".p02", rank == 0 ? 0 : 1, even_ranks);
  Communicator even_comm(even.options, even.settings);
  const float sum = sum_of(even_comm, "sum", static_cast<float>(rank + 1));
  if (sum != 4.0F) problems.push_back("the part of ranks 0 and 2 summed " + std::to_string(sum));

  // A part holding rank 1, which it never joined, formed after it was lost.
  const std::vector<int32_t> first_ranks = {0, 1};
  if (rank == 0) {
    const Part pair = part_of(job, name + ".p01", 0, first_ranks);
    Communicator comm(pair.options, pair.settings);
    SharedBuffer buffer = comm.allocate(4 * sizeof(float));
    problems.push_back(expect_lost("the part of ranks 0 and 1", "rank 1 of job '" + name + "'",
                                   broadcast_from(comm, buffer, 1)));
  }

  // A subgroup of all three, and a part of it holding its rank 1: both fail.
  const std::vector<int32_t> all_ranks = {0, 1, 2};
  const std::string subgroup_name = name + ".all";
  const Part subgroup = part_of(job, subgroup_name, rank, all_ranks);
  Communicator subgroup_comm(subgroup.options, subgroup.settings);
  SharedBuffer value = subgroup_comm.allocate(sizeof(float));
  problems.push_back(
      expect_lost("the subgroup", "rank 1 of job '" + name + "'", sum_in(subgroup_comm, value)));
  if (rank == 0) {
    const Part pair = part_of(subgroup.options, subgroup_name + ".p01", 0, first_ranks);
    Communicator comm(pair.options, pair.settings);
    SharedBuffer buffer = comm.allocate(4 * sizeof(float));
    problems.push_back(expect_lost("the subgroup's part of its ranks 0 and 1",
                                   "rank 1 of job '" + subgroup_name + "'",
                                   broadcast_from(comm, buffer, 1)));
  }
  // Rank 2 holds the subgroup until rank 0's checks are over: then it is over for both.
  if (sum_of(even_comm, "end", 1.0F) != 2.0F) problems.emplace_back("the last sum is wrong");
  return report(rank, problems);
}

int scenario_parts_rank_lost_across_nodes(const gradsync_options& job) {
  const int rank = job.rank;
  const std::string name = job.job;
  std::vector<std::string> problems;
  const Communicator whole = whole_job_without_rank_1(job, problems);
  if (rank == 2) {
    // Rank 1's part with this rank, across the two nodes, which rank 1 never joined: its node
    // has no such job, and tells this one of the loss through the whole job's messages.
    const std::vector<int32_t> ranks = {1, 2};
    const Part pair = part_of(job, name + ".p12", 1, ranks, true);
    Communicator comm(pair.options, pair.settings);
    SharedBuffer buffer = comm.allocate(4 * sizeof(float));
    problems.push_back(expect_lost("the part of ranks 1 and 2", "rank 1 of job '" + name + "'",
                                   broadcast_from(comm, buffer, 0)));
  }
  return report(rank, problems);
}

int scenario_groups_rank_lost(const gradsync_options& job) {
  const int rank = job.rank;
  const std::string name = job.job;
  std::vector<std::string> problems;
  const Communicator whole = whole_job_without_rank_1(job, problems);

  struct Group {
    const char* what;
    gradsync_result (*derive)(const gradsync_options*, gradsync_options*);
  };
  for (const Group& kind :
       {Group{"the node's group", &gradsync_options_node_group},
        Group{"the group across nodes", &gradsync_options_across_nodes_group}}) {
    Part group{};
    std::vector<int32_t> ranks(static_cast<size_t>(job.world_size), -1);
    group.settings.struct_bytes = sizeof(group.settings);
    if (kind.derive(&job, &group.options) != GRADSYNC_OK ||
        gradsync_job_settings_for_group(&job, &group.options, &group.settings, ranks.data(),
                                        ranks.size()) != GRADSYNC_OK) {
      problems.push_back(std::string(kind.what) + ": " + gradsync_last_error(nullptr));
      continue;
    }
    ranks.resize(static_cast<size_t>(group.options.world_size));
    Communicator comm(group.options, group.settings);
    if (std::find(ranks.begin(), ranks.end(), 1) != ranks.end()) {
      SharedBuffer value = comm.allocate(sizeof(float));
      problems.push_back(
          expect_lost(kind.what, "rank 1 of job '" + name + "'", sum_in(comm, value)));
    } else {
      float expected = 0;
      for (const int32_t r : ranks) expected += static_cast<float>(r + 1);
      const float sum = sum_of(comm, "sum", static_cast<float>(rank + 1));
      if (sum != expected) {
        problems.push_back(std::string(kind.what) + " summed " + std::to_string(sum) +
                           ", expected " + std::to_string(expected));
      }
    }
  }

  if (rank == 0) {
    // What is refused, each with its reason.
    gradsync_options node{};
    if (gradsync_options_node_group(&job, &node) != GRADSYNC_OK) {
      problems.push_back(std::string("the node's group: ") + gradsync_last_error(nullptr));
    }
    int32_t room[1];
    auto refused = [&](const char* what, const gradsync_options& group,
                       gradsync_job_settings settings, size_t capacity,
                       const std::string& because) {
      const gradsync_result result =
          gradsync_job_settings_for_group(&job, &group, &settings, room, capacity);
      const std::string message = gradsync_last_error(nullptr);
      if (result != GRADSYNC_ERR_INVALID_ARGUMENT || message.find(because) == std::string::npos) {
        problems.push_back(std::string(what) + ": " + gradsync_result_string(result) + ": " +
                           message);
      }
    };
    gradsync_job_settings settings{};
    settings.struct_bytes = sizeof(settings);
    refused("the job as its own group", job, settings, 1, "is neither of job '" + name + "''s");
    refused("room for one of two ranks", node, settings, 1, "room for 1 ranks");
    settings.struct_bytes = offsetof(gradsync_job_settings, parent_job);
    refused("a struct without parent_ranks", node, settings, 2, "API version 11");
  }
  return report(rank, problems);
}

int scenario_parts_rank_left(const gradsync_options& job) {
  const int rank = job.rank;
  const std::string name = job.job;
  const std::vector<int32_t> ranks = {0, 1};
  const Part pair = part_of(job, name + ".pair", rank, ranks);
  std::vector<std::string> problems;
  Part without_ranks = part_of(job, name + ".unset", rank, ranks);
  without_ranks.settings.parent_ranks = nullptr;
  try {
    const Communicator unset(without_ranks.options, without_ranks.settings);
    problems.emplace_back("a parent job without its ranks was let in");
  } catch (const Error& error) {
    if (error.code() != GRADSYNC_ERR_INVALID_ARGUMENT) {
      problems.push_back(std::string("a parent without ranks was refused otherwise: ") +
                         error.what());
    }
  }
  std::optional<Communicator> whole(std::in_place, job);
  Communicator part(pair.options, pair.settings);
  if (sum_of(part, "before", 1.0F) != 2.0F) problems.emplace_back("the sum before is wrong");

  // A rank naming other ranks in the parent than the part's first rank did: refused.
  const std::vector<int32_t> swapped = {1, 0};
  if (rank == 0) {
    const Part first = part_of(job, name + ".odd", 0, ranks);
    const Communicator odd(first.options, first.settings);
    whole->barrier();
    whole->barrier();  // rank 1 has tried
  } else {
    whole->barrier();
    const Part second = part_of(job, name + ".odd", 1, swapped);
    try {
      const Communicator odd(second.options, second.settings);
      problems.emplace_back("a rank naming other ranks in the parent was let in");
    } catch (const Error& error) {
      if (error.code() != GRADSYNC_ERR_MISMATCH) {
        problems.push_back(std::string("the mismatch was refused otherwise: ") + error.what());
      }
    }
    whole->barrier();
  }

  // Rank 1 leaves the whole job with a goodbye and stays in the part, which runs on.
  if (rank == 1) whole.reset();
  for (int step = 0; step < 3; ++step) {
    if (sum_of(part, "after", 1.0F) != 2.0F) problems.emplace_back("a sum after is wrong");
  }
  return report(rank, problems);
}

}  // namespace gradsync::testing
