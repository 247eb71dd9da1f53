// gradsync-test-rank's scenarios of a rank's groups and of a process heap serving two
// communicators.
#include "tests/integration/rank_scenarios.h"
#include "tools/common/reference.h"

#include <gradsync/gradsync.hpp>

#include <cstring>
#include <vector>

namespace gradsync::testing {

// The node's group and the across-nodes group of this rank (gradsync_options_node_group and
// gradsync_options_across_nodes_group): each group's place is as the layout says, and an
// allreduce in the node's group, then of its result in the across-nodes group, is the whole
// job's allreduce.
int scenario_groups(const RankIdentity& me, const gradsync_options& job) {
  gradsync_options node{};
  gradsync_options across{};
  EXPECT_OR_FAIL(me, gradsync_options_node_group(&job, &node) == GRADSYNC_OK, "node group: %s",
                 gradsync_last_error(nullptr));
  EXPECT_OR_FAIL(me, gradsync_options_across_nodes_group(&job, &across) == GRADSYNC_OK,
                 "across-nodes group: %s", gradsync_last_error(nullptr));
  const int nodes = job.world_size / job.local_world_size;
  EXPECT_OR_FAIL(me, node.rank == job.local_rank && node.world_size == job.local_world_size,
                 "node group: rank %d of %d", node.rank, node.world_size);
  EXPECT_OR_FAIL(me, across.rank == job.rank / job.local_world_size && across.world_size == nodes,
                 "across-nodes group: rank %d of %d", across.rank, across.world_size);
  Communicator node_comm(node);
  Communicator across_comm(across);
  constexpr size_t kCount = 100003;
  SharedBuffer mine = node_comm.allocate(kCount * sizeof(int32_t));
  SharedBuffer node_sum = node_comm.allocate(kCount * sizeof(int32_t));
  SharedBuffer to_send = across_comm.allocate(kCount * sizeof(int32_t));
  SharedBuffer total = across_comm.allocate(kCount * sizeof(int32_t));
  auto* values = static_cast<int32_t*>(mine.data());
  for (size_t i = 0; i < kCount; ++i)
    values[i] = (me.rank + 1) * static_cast<int32_t>(i % 1000 + 1);
  node_comm.wait(
      node_comm.allreduce("g", mine.data(), node_sum.data(), kCount, GRADSYNC_INT32, GRADSYNC_SUM));
  std::memcpy(to_send.data(), node_sum.data(), kCount * sizeof(int32_t));
  across_comm.wait(across_comm.allreduce("g", to_send.data(), total.data(), kCount, GRADSYNC_INT32,
                                         GRADSYNC_SUM));
  const auto* sums = static_cast<const int32_t*>(total.data());
  const int32_t ranks_sum = me.ranks * (me.ranks + 1) / 2;
  for (size_t i = 0; i < kCount; ++i) {
    const int32_t expected = ranks_sum * static_cast<int32_t>(i % 1000 + 1);
    EXPECT_OR_FAIL(me, sums[i] == expected, "element %zu: %d, expected %d", i, sums[i], expected);
  }
  return 0;
}

// A heap of the process (gradsync_heap_create) serving two communicators of two jobs with no
// registration: every kind of collective on its memory checked against the reference; memory of
// neither refused with a clear error; then `cycles` times a block larger than an arena taken,
// used and freed, so that the heap lets its arena go (run it with fewer buffers allowed a
// client than cycles: the test holds only if each released arena is unregistered).
int scenario_heap(const RankIdentity& me, const gradsync_options& job, int cycles) {
  gradsync::Heap heap;
  gradsync_options node{};
  EXPECT_OR_FAIL(me, gradsync_options_node_group(&job, &node) == GRADSYNC_OK, "node group: %s",
                 gradsync_last_error(nullptr));
  Communicator comm(job);
  Communicator node_comm(node);
  comm.attach(heap);
  node_comm.attach(heap);
  node_comm.attach(heap);  // twice is no error
  constexpr size_t kCount = 300007;
  const size_t bytes = kCount * sizeof(float) * static_cast<size_t>(job.world_size);
  auto* a = static_cast<uint8_t*>(heap.allocate(bytes));
  auto* b = static_cast<uint8_t*>(heap.allocate(bytes));
  uint64_t seed = 5000;
  struct Member {
    Communicator* comm;
    int rank;
    int ranks;
  };
  for (const auto& [c, rank, ranks] :
       {Member{&comm, job.rank, job.world_size}, Member{&node_comm, node.rank, node.world_size}}) {
    for (const bool in_place : {false, true}) {
      reference::fill_input(a, kCount, GRADSYNC_FLOAT32, rank, GRADSYNC_SUM, ++seed);
      uint8_t* out = in_place ? a : b;
      c->wait(c->allreduce("heap.ar", a, out, kCount, GRADSYNC_FLOAT32, GRADSYNC_SUM));
      const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, out, kCount,
                                                  GRADSYNC_FLOAT32, GRADSYNC_SUM, ranks, 0, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "allreduce on heap memory, in place %d: %zu wrong", in_place,
                     wrong);
    }
    reference::fill_input(a, kCount, GRADSYNC_INT32, rank, GRADSYNC_SUM, ++seed);
    c->wait(c->allgather("heap.ag", a, b, kCount, GRADSYNC_INT32));
    size_t wrong = reference::count_wrong(reference::Kind::kAllgather, b, kCount, GRADSYNC_INT32,
                                          GRADSYNC_SUM, ranks, 0, seed);
    EXPECT_OR_FAIL(me, wrong == 0, "allgather on heap memory: %zu wrong", wrong);
    reference::fill_input(a, kCount * static_cast<size_t>(ranks), GRADSYNC_FLOAT32, rank,
                          GRADSYNC_MAX, ++seed);
    c->wait(c->reduce_scatter("heap.rs", a, b, kCount, GRADSYNC_FLOAT32, GRADSYNC_MAX));
    wrong = reference::count_wrong_reduce_scatter(b, kCount, GRADSYNC_FLOAT32, GRADSYNC_MAX, ranks,
                                                  rank, seed);
    EXPECT_OR_FAIL(me, wrong == 0, "reduce-scatter on heap memory: %zu wrong", wrong);
    constexpr size_t kWide = kCount / 2;  // int64s: the same bytes
    reference::fill_input(a, kWide * static_cast<size_t>(ranks), GRADSYNC_INT64, rank, GRADSYNC_SUM,
                          ++seed);
    c->wait(c->alltoall("heap.a2a", a, b, kWide, GRADSYNC_INT64));
    wrong =
        reference::count_wrong_alltoall(b, kWide, GRADSYNC_INT64, GRADSYNC_SUM, ranks, rank, seed);
    EXPECT_OR_FAIL(me, wrong == 0, "all-to-all on heap memory: %zu wrong", wrong);
  }
  // Memory of neither the heap nor a registration: refused before it reaches the daemon.
  std::vector<float> private_memory(64);
  gradsync_request request = 0;
  const gradsync_result refused =
      gradsync_allreduce(comm.get(), "private", private_memory.data(), private_memory.data(),
                         private_memory.size(), GRADSYNC_FLOAT32, GRADSYNC_SUM, &request);
  EXPECT_OR_FAIL(me,
                 refused == GRADSYNC_ERR_INVALID_ARGUMENT &&
                     std::strstr(gradsync_last_error(comm.get()), "registered") != nullptr,
                 "private memory: %s (%d)", gradsync_last_error(comm.get()), refused);
  EXPECT_OR_FAIL(
      me, gradsync_heap_free(heap.get(), private_memory.data()) == GRADSYNC_ERR_INVALID_ARGUMENT,
      "freeing memory the heap did not allocate was not refused");
  // Larger than an arena's least size: an arena of its own, let go of once freed.
  constexpr size_t kArenaSized = 65ull << 20;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    auto* big = static_cast<uint8_t*>(heap.allocate(kArenaSized));
    uint8_t* end = big + kArenaSized - kCount * sizeof(float);  // the arena's far end
    reference::fill_input(end, kCount, GRADSYNC_FLOAT32, me.rank, GRADSYNC_SUM, ++seed);
    comm.wait(comm.allreduce("heap.big", end, end, kCount, GRADSYNC_FLOAT32, GRADSYNC_SUM));
    const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, end, kCount,
                                                GRADSYNC_FLOAT32, GRADSYNC_SUM, me.ranks, 0, seed);
    EXPECT_OR_FAIL(me, wrong == 0, "cycle %d: allreduce in an arena of its own: %zu wrong", cycle,
                   wrong);
    heap.free(big);
  }
  heap.free(a);
  heap.free(b);
  return 0;
}

}  // namespace gradsync::testing
