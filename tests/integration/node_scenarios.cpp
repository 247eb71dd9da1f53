// gradsync-test-rank's scenarios across nodes, and the training-shaped loops of each kind of
// collective that the cluster tests run at many shapes.
#include "ipc/protocol.h"
#include "tests/integration/rank_scenarios.h"
#include "tools/common/reference.h"

#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace gradsync::testing {

// Across nodes: allreduce for every dtype and op, counts below and not divisible by the node
// count, then every collective, many tensors in per-rank random order, groups and barriers.
int scenario_cluster(Communicator& comm, const RankIdentity& me) {
  const size_t max_count = 100003;
  SharedBuffer a = comm.allocate(max_count * 8);
  SharedBuffer b = comm.allocate(max_count * 8);
  uint64_t seed = 0;
  for (int step = 0; step < 2; ++step) {  // the second pass reuses every name
    for (gradsync_dtype dtype : kDtypes) {
      for (size_t count : {size_t{1}, size_t{2}, size_t{3}, size_t{1001}, max_count}) {
        for (gradsync_op op : kOps) {
          if (!gradsync::ipc::op_reduces(op, dtype)) continue;
          ++seed;
          reference::fill_input(a.data(), count, dtype, me.rank, op, seed);
          const std::string name =
              "c." + std::to_string(dtype) + "." + std::to_string(count) + "." + std::to_string(op);
          comm.wait(comm.allreduce(name.c_str(), a.data(), b.data(), count, dtype, op));
          const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, b.data(), count,
                                                      dtype, op, me.ranks, 0, seed);
          EXPECT_OR_FAIL(me, wrong == 0, "allreduce dtype %d op %d count %zu: %zu wrong", dtype, op,
                         count, wrong);
        }
      }
    }
  }
  for (int i = 0; i < 5; ++i) comm.barrier();
  if (const int failed = scenario_collectives(comm, me); failed != 0) return failed;
  if (const int failed = scenario_random_order(comm, me); failed != 0) return failed;
  return scenario_grouped(comm, me);
}

// Training-shaped: `steps` steps of the same `tensors` gradient names (1 to `max_count` floats
// each), submitted in a different order on every rank and step, then waited for and checked.
// After the first step every name is in the daemons' response cache (when they have one).
int scenario_steps(Communicator& comm, const RankIdentity& me, int steps, size_t tensors,
                   size_t max_count) {
  const size_t kTensors = tensors;
  std::vector<size_t> counts(kTensors);
  std::vector<size_t> offsets(kTensors);
  size_t total = 0;
  for (size_t i = 0; i < kTensors; ++i) {
    counts[i] = 1 + (i * 7919) % max_count;
    offsets[i] = total;
    total += counts[i];
  }
  SharedBuffer buffer = comm.allocate(total * sizeof(float));
  auto* data = static_cast<float*>(buffer.data());
  std::mt19937 random(static_cast<unsigned>(me.rank) * 7 + 1);
  std::vector<size_t> order(kTensors);
  std::iota(order.begin(), order.end(), 0);
  for (int step = 0; step < steps; ++step) {
    std::shuffle(order.begin(), order.end(), random);
    std::vector<gradsync_request> requests(kTensors);
    for (size_t i : order) {
      const uint64_t seed = static_cast<uint64_t>(step) * kTensors + i + 1;
      reference::fill_input(data + offsets[i], counts[i], GRADSYNC_FLOAT32, me.rank, GRADSYNC_SUM,
                            seed);
      const std::string name = "grad." + std::to_string(i);
      requests[i] = comm.allreduce(name.c_str(), data + offsets[i], data + offsets[i], counts[i],
                                   GRADSYNC_FLOAT32, GRADSYNC_SUM);
    }
    for (size_t i = 0; i < kTensors; ++i) {
      comm.wait(requests[i]);
      const uint64_t seed = static_cast<uint64_t>(step) * kTensors + i + 1;
      const size_t wrong =
          reference::count_wrong(reference::Kind::kAllreduce, data + offsets[i], counts[i],
                                 GRADSYNC_FLOAT32, GRADSYNC_SUM, me.ranks, 0, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "step %d tensor %zu: %zu wrong", step, i, wrong);
    }
  }
  return 0;
}

// `steps` steps of the same allgathers: two small ones (which piggyback on the
// negotiation) and a large one (over the network), out of place and in place,
// each checked against the reference.
int scenario_allgathers(Communicator& comm, const RankIdentity& me, int steps) {
  struct Gathered {
    const char* name;
    gradsync_dtype dtype;
    size_t count;  // per rank
    bool in_place;
  };
  const Gathered gathered[] = {{"ag.small.f32", GRADSYNC_FLOAT32, 3, false},
                               {"ag.small.f64", GRADSYNC_FLOAT64, 100, true},
                               {"ag.large", GRADSYNC_FLOAT32, 100003, false},
                               {"ag.large.in_place", GRADSYNC_FLOAT32, 100003, true}};
  const size_t most = 100003 * sizeof(float) * static_cast<size_t>(me.ranks);
  SharedBuffer send_buffer = comm.allocate(most);
  SharedBuffer recv_buffer = comm.allocate(most);
  uint64_t seed = 0;
  for (int step = 0; step < steps; ++step) {
    for (const Gathered& g : gathered) {
      ++seed;
      const size_t block = g.count * gradsync_dtype_size(g.dtype);
      auto* recv = recv_buffer.as<uint8_t>();
      uint8_t* send =
          g.in_place ? recv + static_cast<size_t>(me.rank) * block : send_buffer.as<uint8_t>();
      reference::fill_input(send, g.count, g.dtype, me.rank, GRADSYNC_SUM, seed);
      comm.wait(comm.allgather(me.name_or_none(g.name), send, recv, g.count, g.dtype));
      const size_t wrong = reference::count_wrong(reference::Kind::kAllgather, recv, g.count,
                                                  g.dtype, GRADSYNC_SUM, me.ranks, 0, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "step %d allgather %s: %zu wrong", step, g.name, wrong);
    }
  }
  return 0;
}

// `steps` steps of the same reduce-scatters: a small one (which piggybacks on the
// negotiation) and large ones (over the network, in pipelined pieces, with a
// count no piece size divides), out of place and in place, sum and average, each checked
// against the reference; then `hold_ms` idle (arguments: STEPS [unnamed|named] [HOLD_MS]).
int scenario_reduce_scatters(Communicator& comm, const RankIdentity& me, int steps, int hold_ms) {
  struct Scattered {
    const char* name;
    gradsync_dtype dtype;
    gradsync_op op;
    size_t count;  // per rank
    bool in_place;
  };
  const Scattered scattered[] = {
      {"rs.small", GRADSYNC_FLOAT32, GRADSYNC_SUM, 5, false},
      {"rs.large", GRADSYNC_FLOAT32, GRADSYNC_AVG, 1500007, false},
      {"rs.large.in_place", GRADSYNC_INT32, GRADSYNC_SUM, 1500007, true}};
  const size_t most = 1500007 * sizeof(float) * static_cast<size_t>(me.ranks);
  SharedBuffer send_buffer = comm.allocate(most);
  SharedBuffer recv_buffer = comm.allocate(most);
  uint64_t seed = 0;
  for (int step = 0; step < steps; ++step) {
    for (const Scattered& r : scattered) {
      ++seed;
      const size_t block = r.count * gradsync_dtype_size(r.dtype);
      auto* send = send_buffer.as<uint8_t>();
      uint8_t* recv =
          r.in_place ? send + static_cast<size_t>(me.rank) * block : recv_buffer.as<uint8_t>();
      reference::fill_input(send, r.count * static_cast<size_t>(me.ranks), r.dtype, me.rank, r.op,
                            seed);
      comm.wait(comm.reduce_scatter(me.name_or_none(r.name), send, recv, r.count, r.dtype, r.op));
      const size_t wrong = reference::count_wrong_reduce_scatter(recv, r.count, r.dtype, r.op,
                                                                 me.ranks, me.rank, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "step %d reduce-scatter %s: %zu wrong", step, r.name, wrong);
    }
  }
  // The job stays, idle, for whoever inspects the daemons.
  std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  return 0;
}

// `steps` steps of the same all-to-alls: a small one (which piggybacks on the
// negotiation), a large one (a stream between each pair of nodes) and an
// empty one, each checked against the reference.
int scenario_alltoalls(Communicator& comm, const RankIdentity& me, int steps) {
  struct Exchanged {
    const char* name;
    gradsync_dtype dtype;
    size_t count;  // per block
  };
  const Exchanged exchanged[] = {{"a2a.small", GRADSYNC_INT32, 3},
                                 {"a2a.large", GRADSYNC_FLOAT64, 300007},
                                 {"a2a.empty", GRADSYNC_INT32, 0}};
  const size_t most = 300007 * sizeof(double) * static_cast<size_t>(me.ranks);
  SharedBuffer send_buffer = comm.allocate(most);
  SharedBuffer recv_buffer = comm.allocate(most);
  uint64_t seed = 0;
  for (int step = 0; step < steps; ++step) {
    for (const Exchanged& x : exchanged) {
      ++seed;
      reference::fill_input(send_buffer.data(), x.count * static_cast<size_t>(me.ranks), x.dtype,
                            me.rank, GRADSYNC_SUM, seed);
      comm.wait(comm.alltoall(me.name_or_none(x.name), send_buffer.data(), recv_buffer.data(),
                              x.count, x.dtype));
      const size_t wrong = reference::count_wrong_alltoall(recv_buffer.data(), x.count, x.dtype,
                                                           GRADSYNC_SUM, me.ranks, me.rank, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "step %d all-to-all %s: %zu wrong", step, x.name, wrong);
    }
  }
  return 0;
}

// Allreduces big enough that the inter-node algorithms cut them into pipelined pieces
// (cost_model.h: kPipelinePieceBytes per node's share), with a count no node count divides:
// out of place and in place, sum and average, each checked against the reference.
int scenario_large(Communicator& comm, const RankIdentity& me, size_t count) {
  SharedBuffer a = comm.allocate(count * 4);
  SharedBuffer b = comm.allocate(count * 4);
  uint64_t seed = 1000;
  for (const gradsync_op op : {GRADSYNC_SUM, GRADSYNC_AVG}) {
    for (const bool in_place : {false, true}) {
      ++seed;
      reference::fill_input(a.data(), count, GRADSYNC_FLOAT32, me.rank, op, seed);
      void* out = in_place ? a.data() : b.data();
      comm.wait(comm.allreduce("large", a.data(), out, count, GRADSYNC_FLOAT32, op));
      const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, out, count,
                                                  GRADSYNC_FLOAT32, op, me.ranks, 0, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "allreduce of %zu floats, op %d, %s: %zu wrong", count, op,
                     in_place ? "in place" : "out of place", wrong);
    }
  }
  return 0;
}

// Float sums whose bits depend on the order of their additions (inputs of every magnitude from
// 2^-20 to 2^20), with GRADSYNC_ALGO=direct: every result must be the nodes' sums added in node
// order, each node's sum its ranks' inputs in local rank order (ranks placed in blocks of
// `ranks_per_node`), to the bit, whether the tensors fuse (submitted together), go one by one
// or come in another order; small ones piggyback on the negotiation, large ones do not.
int scenario_node_order(Communicator& comm, const RankIdentity& me, int ranks_per_node) {
  const std::vector<size_t> counts = {7, 3000, 70001, 300007};
  auto input = [](int rank, size_t tensor, size_t count) {
    std::vector<float> values(count);
    reference::fill_mixed_magnitudes(values.data(), count,
                                     static_cast<uint32_t>(rank * 131 + static_cast<int>(tensor)));
    return values;
  };
  std::vector<std::vector<float>> expected(counts.size());
  for (size_t t = 0; t < counts.size(); ++t) {
    std::vector<std::vector<float>> inputs;
    inputs.reserve(static_cast<size_t>(me.ranks));
    for (int rank = 0; rank < me.ranks; ++rank) inputs.push_back(input(rank, t, counts[t]));
    expected[t].resize(counts[t]);
    for (size_t i = 0; i < counts[t]; ++i) {
      float total = 0;
      const auto per_node = static_cast<size_t>(ranks_per_node);
      for (size_t first = 0; first < inputs.size(); first += per_node) {
        float sum = inputs[first][i];
        for (size_t local = 1; local < per_node; ++local) sum += inputs[first + local][i];
        total = first == 0 ? sum : total + sum;
      }
      expected[t][i] = total;
    }
  }
  std::vector<SharedBuffer> sends;
  std::vector<SharedBuffer> recvs;
  for (size_t t = 0; t < counts.size(); ++t) {
    sends.push_back(comm.allocate(counts[t] * sizeof(float)));
    const std::vector<float> mine = input(me.rank, t, counts[t]);
    std::memcpy(sends.back().data(), mine.data(), counts[t] * sizeof(float));
    recvs.push_back(comm.allocate(counts[t] * sizeof(float)));
  }
  for (const char* how : {"together", "one by one", "backwards"}) {
    for (auto& recv : recvs) std::memset(recv.data(), 0, recv.size());
    std::vector<gradsync_request> requests(counts.size());
    for (size_t k = 0; k < counts.size(); ++k) {
      const size_t t = std::strcmp(how, "backwards") == 0 ? counts.size() - 1 - k : k;
      const std::string name = "grad." + std::to_string(t);
      requests[t] = comm.allreduce(name.c_str(), sends[t].data(), recvs[t].data(), counts[t],
                                   GRADSYNC_FLOAT32, GRADSYNC_SUM);
      if (std::strcmp(how, "one by one") == 0) comm.wait(requests[t]);
    }
    for (size_t t = 0; t < counts.size(); ++t) {
      if (std::strcmp(how, "one by one") != 0) comm.wait(requests[t]);
      size_t differ = 0;
      const auto* got = static_cast<const float*>(recvs[t].data());
      for (size_t i = 0; i < counts[t]; ++i) {
        differ +=
            std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(expected[t][i]) ? 1 : 0;
      }
      EXPECT_OR_FAIL(me, differ == 0, "%s: tensor %zu of %zu floats: %zu not the node-order sum",
                     how, t, counts[t], differ);
    }
  }
  return 0;
}

// Broadcasts of `count` floats from every root, out of place and in place (the root's buffer
// is its result), each checked against the reference: large enough, the nodes pass them along
// a chain in pieces (cost_model.h).
int scenario_broadcasts(Communicator& comm, const RankIdentity& me, size_t count) {
  SharedBuffer a = comm.allocate(count * 4);
  SharedBuffer b = comm.allocate(count * 4);
  uint64_t seed = 2000;
  for (int root = 0; root < me.ranks; ++root) {
    for (const bool in_place : {false, true}) {
      ++seed;
      reference::fill_input(a.data(), count, GRADSYNC_FLOAT32, me.rank, GRADSYNC_SUM, seed);
      void* out = in_place && me.rank == root ? a.data() : b.data();
      comm.wait(comm.broadcast("big", a.data(), out, count, GRADSYNC_FLOAT32, root));
      const size_t wrong =
          reference::count_wrong(reference::Kind::kBroadcast, out, count, GRADSYNC_FLOAT32,
                                 GRADSYNC_SUM, me.ranks, root, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "broadcast of %zu floats from rank %d, %s: %zu wrong", count,
                     root, in_place ? "in place" : "out of place", wrong);
    }
  }
  return 0;
}

// Small broadcasts from every root, each root's under names of its own (a name's root is part
// of its signature), out of place and in place, and a large one that does not piggyback; `steps`
// times, every result against the reference.
int scenario_small_broadcasts(Communicator& comm, const RankIdentity& me, int steps) {
  struct Broadcast {
    const char* name;
    gradsync_dtype dtype;
    size_t count;
    bool in_place;
  };
  const Broadcast broadcasts[] = {{"bc.small.f32", GRADSYNC_FLOAT32, 5, false},
                                  {"bc.small.f64", GRADSYNC_FLOAT64, 100, true},
                                  {"bc.large", GRADSYNC_FLOAT32, 100003, false}};
  const size_t most = 100003 * sizeof(float);
  SharedBuffer a = comm.allocate(most);
  SharedBuffer b = comm.allocate(most);
  uint64_t seed = 3000;
  for (int step = 0; step < steps; ++step) {
    for (int root = 0; root < me.ranks; ++root) {
      for (const Broadcast& bc : broadcasts) {
        ++seed;
        const std::string name = std::string(bc.name) + ".from" + std::to_string(root);
        reference::fill_input(a.data(), bc.count, bc.dtype, me.rank, GRADSYNC_SUM, seed);
        void* out = bc.in_place && me.rank == root ? a.data() : b.data();
        comm.wait(
            comm.broadcast(me.name_or_none(name.c_str()), a.data(), out, bc.count, bc.dtype, root));
        const size_t wrong = reference::count_wrong(reference::Kind::kBroadcast, out, bc.count,
                                                    bc.dtype, GRADSYNC_SUM, me.ranks, root, seed);
        EXPECT_OR_FAIL(me, wrong == 0, "step %d broadcast %s: %zu wrong", step, name.c_str(),
                       wrong);
      }
    }
  }
  return 0;
}

// f32 allreduces through the bf16 wire codec (GRADSYNC_WIRE_CODEC=bf16) on inputs bf16 cannot
// hold: every element within the codec's error of the exact result, every element a bf16
// value (the result travelled encoded, and the node that finished it kept what it sent), and
// every rank's result the same to the bit (their hashes gathered through gradsync).
int scenario_encoded(Communicator& comm, const RankIdentity& me, size_t count) {
  SharedBuffer in = comm.allocate(count * 4);
  SharedBuffer out = comm.allocate(count * 4);
  SharedBuffer own_hash = comm.allocate(8);
  SharedBuffer hashes = comm.allocate(static_cast<size_t>(me.ranks) * 8);
  auto input = [](int rank, size_t i) {
    return static_cast<float>(1.0 + 0.001 * static_cast<double>((rank + 1) * (i % 997)) +
                              static_cast<double>(rank) / 3.0);
  };
  auto* sent = static_cast<float*>(in.data());
  for (size_t i = 0; i < count; ++i) sent[i] = input(me.rank, i);
  for (const gradsync_op op : {GRADSYNC_SUM, GRADSYNC_AVG, GRADSYNC_MAX}) {
    comm.wait(comm.allreduce("encoded", in.data(), out.data(), count, GRADSYNC_FLOAT32, op));
    const auto* got = static_cast<const float*>(out.data());
    for (size_t i = 0; i < count; ++i) {
      double exact = op == GRADSYNC_MAX ? -1e300 : 0;
      double magnitude = 0;
      for (int r = 0; r < me.ranks; ++r) {
        const double x = input(r, i);
        exact = op == GRADSYNC_MAX ? std::max(exact, x) : exact + x;
        magnitude += std::abs(x);
      }
      if (op == GRADSYNC_AVG) {
        exact /= me.ranks;
        magnitude /= me.ranks;
      }
      // One rounding to bf16's 8 significant bits (relative error <= 2^-8) of a partial sum
      // per node (a ring's hops, or each node's push to an aggregator) and one at the end.
      const double bound = (me.ranks + 1) * std::ldexp(magnitude, -8);
      EXPECT_OR_FAIL(me, std::abs(got[i] - exact) <= bound,
                     "op %d element %zu: %.9g, exact %.9g (bound %.3g)", op, i, got[i], exact,
                     bound);
      EXPECT_OR_FAIL(me, (std::bit_cast<uint32_t>(got[i]) & 0xffffu) == 0,
                     "op %d element %zu: %.9g is no bf16 value", op, i, got[i]);
    }
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the result's bytes
    for (size_t b = 0; b < count * 4; ++b) {
      hash = (hash ^ static_cast<const uint8_t*>(out.data())[b]) * 1099511628211ull;
    }
    std::memcpy(own_hash.data(), &hash, sizeof(hash));
    comm.wait(comm.allgather("encoded.hash", own_hash.data(), hashes.data(), 1, GRADSYNC_INT64));
    const auto* all = static_cast<const uint64_t*>(hashes.data());
    for (int r = 0; r < me.ranks; ++r) {
      EXPECT_OR_FAIL(me, all[r] == all[0], "op %d: rank %d's result differs from rank 0's", op, r);
    }
  }
  // The codec is for f32: the other dtypes' results stay exact.
  uint64_t seed = 77;
  for (const gradsync_dtype dtype : {GRADSYNC_FLOAT64, GRADSYNC_BFLOAT16, GRADSYNC_INT32}) {
    const size_t elements = count * 4 / gradsync_dtype_size(dtype);
    reference::fill_input(in.data(), elements, dtype, me.rank, GRADSYNC_SUM, ++seed);
    comm.wait(
        comm.allreduce("encoded.other", in.data(), out.data(), elements, dtype, GRADSYNC_SUM));
    const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, out.data(), elements,
                                                dtype, GRADSYNC_SUM, me.ranks, 0, seed);
    EXPECT_OR_FAIL(me, wrong == 0, "dtype %d with the codec asked for: %zu wrong", dtype, wrong);
  }
  return 0;
}

}  // namespace gradsync::testing
