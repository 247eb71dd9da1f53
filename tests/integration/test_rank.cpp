// gradsync-test-rank: one rank of an integration test, a real client process. Identity comes
// from the environment, as for any rank. The scenario is argv[1]; the exit status is the result
// (0: every check passed; for the fault scenarios, the gradsync_result the rank ended with).
// The scenarios themselves: rank_scenarios.h, parts_scenario.h, topk_scenario.h.
#include "tests/integration/parts_scenario.h"
#include "tests/integration/rank_scenarios.h"
#include "tests/integration/topk_scenario.h"

#include <gradsync/gradsync.hpp>

#include <grp.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace gradsync::testing {
namespace {

int run(std::vector<std::string> args) {
  // --as-uid N: become another user first (the tests run as root).
  if (args.size() >= 2 && args[0] == "--as-uid") {
    const auto uid = static_cast<uid_t>(std::stoul(args[1]));
    if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) {
      std::perror("setuid");
      return 100;
    }
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.empty()) {
    std::fprintf(stderr, "usage: gradsync-test-rank [--as-uid N] SCENARIO [ARGS]\n");
    return 64;
  }
  gradsync_options options{};
  gradsync_options_from_env(&options);
  RankIdentity me{options.rank, options.world_size};
  const std::string& scenario = args[0];
  if (scenario == "join") {
    // Connect and report the outcome as the exit status.
    gradsync_comm* comm = nullptr;
    const gradsync_result result = gradsync_connect(&options, &comm);
    if (result != GRADSYNC_OK) std::fprintf(stderr, "join: %s\n", gradsync_last_error(nullptr));
    gradsync_disconnect(comm);
    return static_cast<int>(result);
  }
  try {
    if (scenario == "groups") return scenario_groups(me, options);
    if (scenario == "heap") return scenario_heap(me, options, std::stoi(args.at(1)));
    if (scenario == "parts_rank_lost") return scenario_parts_rank_lost(options);
    if (scenario == "parts_rank_left") return scenario_parts_rank_left(options);
    if (scenario == "groups_rank_lost") {
      return scenario_groups_rank_lost(options);
    }
    if (scenario == "parts_rank_lost_across_nodes") {
      return scenario_parts_rank_lost_across_nodes(options);
    }
    me.unnamed = args.size() > 2 && args[2] == "unnamed";
    Communicator comm(options);
    if (scenario == "collectives") return scenario_collectives(comm, me);
    if (scenario == "device_refused") return scenario_device_refused(comm, me);
    if (scenario == "random_order") return scenario_random_order(comm, me);
    if (scenario == "grouped") return scenario_grouped(comm, me);
    if (scenario == "wait_timeout") return scenario_wait_timeout(comm, me);
    if (scenario == "mixed") return scenario_mixed(comm, me);
    if (scenario == "priorities") return scenario_priorities(comm, me);
    if (scenario == "fused_sizes") {
      return scenario_fused_sizes(comm, me, args.size() > 1 ? std::stoi(args[1]) : 1);
    }
    if (scenario == "withhold") {
      return scenario_withhold(comm, me, args.size() > 1 ? args[1] : "local rank(s) 1",
                               args.size() > 2 ? std::stoi(args[2]) : 1);
    }
    if (scenario == "waiting_for") {
      return scenario_waiting_for(comm, me, args.size() > 1 ? args[1] : "job rank(s) 1");
    }
    if (scenario == "mismatch") return scenario_mismatch(comm, me);
    if (scenario == "cluster") return scenario_cluster(comm, me);
    if (scenario == "steps") {
      return scenario_steps(comm, me, args.size() > 1 ? std::stoi(args[1]) : 20,
                            args.size() > 2 ? std::stoul(args[2]) : 24,
                            args.size() > 3 ? std::stoul(args[3]) : 40000);
    }
    if (scenario == "large") return scenario_large(comm, me, std::stoul(args.at(1)));
    if (scenario == "node_order") return scenario_node_order(comm, me, options.local_world_size);
    if (scenario == "allgathers") return scenario_allgathers(comm, me, std::stoi(args.at(1)));
    if (scenario == "reduce_scatters") {
      return scenario_reduce_scatters(comm, me, std::stoi(args.at(1)),
                                      args.size() > 3 ? std::stoi(args[3]) : 0);
    }
    if (scenario == "alltoalls") return scenario_alltoalls(comm, me, std::stoi(args.at(1)));
    if (scenario == "broadcasts") return scenario_broadcasts(comm, me, std::stoul(args.at(1)));
    if (scenario == "small_broadcasts") {
      return scenario_small_broadcasts(comm, me, std::stoi(args.at(1)));
    }
    if (scenario == "encoded") return scenario_encoded(comm, me, std::stoul(args.at(1)));
    if (scenario == "topk") {
      return scenario_topk(comm, me.rank, me.ranks, options.local_world_size,
                           std::stod(args.at(1)));
    }
    if (scenario == "loop" || scenario == "loop_polling" || scenario == "loop_broadcast") {
      return scenario_loop(comm, me, args.size() > 1 ? std::stoul(args[1]) : 4096,
                           scenario == "loop_polling", scenario == "loop_broadcast");
    }
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 64;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", me.rank, e.what());
    return 100 + static_cast<int>(e.code());
  }
}

}  // namespace
}  // namespace gradsync::testing

int main(int argc, char** argv) {
  return gradsync::testing::run(std::vector<std::string>(argv + 1, argv + argc));
}
