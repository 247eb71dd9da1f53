// gradsync-test-rank's scenarios (test_rank.cpp runs the one argv names), by topic: each
// returns the rank's exit status, 0 when every check passed.
#pragma once

#include <gradsync/gradsync.hpp>

#include <cstddef>
#include <cstdio>
#include <string>

namespace gradsync::testing {

// Who this process is in its job, for the scenarios' references and messages.
struct RankIdentity {
  int rank = 0;
  int ranks = 1;
  // The scenarios of small and large collectives of one kind take "unnamed" (or "named") after
  // their step count: unnamed, they submit without names, as the torch.distributed backend
  // does.
  bool unnamed = false;

  const char* name_or_none(const char* name) const { return unnamed ? nullptr : name; }
};

// Fails the scenario (returns 1) with a message naming the rank and the line.
#define EXPECT_OR_FAIL(me, cond, ...)                                          \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "rank %d: %s:%d: ", (me).rank, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                       \
      std::fprintf(stderr, "\n");                                              \
      return 1;                                                                \
    }                                                                          \
  } while (0)

inline constexpr gradsync_dtype kDtypes[] = {GRADSYNC_FLOAT32,  GRADSYNC_FLOAT64, GRADSYNC_FLOAT16,
                                             GRADSYNC_BFLOAT16, GRADSYNC_INT32,   GRADSYNC_INT64};
// Each op with the dtypes it reduces (ipc::op_reduces: the bitwise ops take the integers).
inline constexpr gradsync_op kOps[] = {GRADSYNC_SUM,  GRADSYNC_AVG,  GRADSYNC_MIN, GRADSYNC_MAX,
                                       GRADSYNC_PROD, GRADSYNC_BAND, GRADSYNC_BOR, GRADSYNC_BXOR};

// collective_scenarios.cpp
int scenario_device_refused(Communicator& comm, const RankIdentity& me);
int scenario_collectives(Communicator& comm, const RankIdentity& me);
int scenario_random_order(Communicator& comm, const RankIdentity& me);
int scenario_mixed(Communicator& comm, const RankIdentity& me);
int scenario_fused_sizes(Communicator& comm, const RankIdentity& me, int rounds);
int scenario_grouped(Communicator& comm, const RankIdentity& me);
int scenario_mismatch(Communicator& comm, const RankIdentity& me);
int scenario_priorities(Communicator& comm, const RankIdentity& me);

// waiting_scenarios.cpp
int scenario_withhold(Communicator& comm, const RankIdentity& me, const std::string& missing,
                      int submitters);
int scenario_waiting_for(Communicator& comm, const RankIdentity& me, const std::string& missing);
int scenario_wait_timeout(Communicator& comm, const RankIdentity& me);
int scenario_loop(Communicator& comm, const RankIdentity& me, size_t bytes, bool polling,
                  bool broadcast);

// node_scenarios.cpp
int scenario_cluster(Communicator& comm, const RankIdentity& me);
int scenario_steps(Communicator& comm, const RankIdentity& me, int steps, size_t tensors,
                   size_t max_count);
int scenario_allgathers(Communicator& comm, const RankIdentity& me, int steps);
int scenario_reduce_scatters(Communicator& comm, const RankIdentity& me, int steps, int hold_ms);
int scenario_alltoalls(Communicator& comm, const RankIdentity& me, int steps);
int scenario_large(Communicator& comm, const RankIdentity& me, size_t count);
int scenario_node_order(Communicator& comm, const RankIdentity& me, int ranks_per_node);
int scenario_broadcasts(Communicator& comm, const RankIdentity& me, size_t count);
int scenario_small_broadcasts(Communicator& comm, const RankIdentity& me, int steps);
int scenario_encoded(Communicator& comm, const RankIdentity& me, size_t count);

// group_scenarios.cpp
int scenario_groups(const RankIdentity& me, const gradsync_options& job);
int scenario_heap(const RankIdentity& me, const gradsync_options& job, int cycles);

}  // namespace gradsync::testing
