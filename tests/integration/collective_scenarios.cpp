// gradsync-test-rank's scenarios of one job's collectives: every kind, op and dtype; orders,
// fusion, groups, mismatches and priorities.
#include "ipc/protocol.h"
#include "tests/integration/rank_scenarios.h"
#include "tools/common/reference.h"

#include <gradsync/gradsync.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace gradsync::testing {
namespace {

// Waits for `request`, which must fail as a mismatch whose message holds both words.
int expect_mismatch(Communicator& comm, const RankIdentity& me, gradsync_request request,
                    const char* first, const char* second) {
  const gradsync_result result = gradsync_wait(comm.get(), request);
  const std::string message = gradsync_last_error(comm.get());
  EXPECT_OR_FAIL(me, result == GRADSYNC_ERR_MISMATCH, "expected a mismatch, got %d (%s)", result,
                 message.c_str());
  EXPECT_OR_FAIL(
      me, message.find(first) != std::string::npos && message.find(second) != std::string::npos,
      "message does not name %s and %s: %s", first, second, message.c_str());
  return 0;
}

}  // namespace

// Host memory offered as device memory through the C++ wrapper: refused (no driver, or not
// device memory), and the communicator goes on serving host memory.
int scenario_device_refused(Communicator& comm, const RankIdentity& me) {
  SharedBuffer buffer = comm.allocate(4096);
  try {
    auto registration = comm.register_device(buffer.data(), 4096);
    std::fprintf(stderr, "device_refused: host memory was accepted as device memory\n");
    return 1;
  } catch (const gradsync::Error& e) {
    if (e.code() != GRADSYNC_ERR_UNSUPPORTED && e.code() != GRADSYNC_ERR_INVALID_ARGUMENT) {
      std::fprintf(stderr, "device_refused: unexpected %s\n", e.what());
      return 1;
    }
  }
  comm.set_cuda_stream(nullptr);  // only a setting: host collectives are not affected
  auto* data = static_cast<float*>(buffer.data());
  for (int i = 0; i < 1024; ++i) data[i] = static_cast<float>(me.rank + 1);
  comm.wait(comm.allreduce("after-refusal", data, data, 1024, GRADSYNC_FLOAT32, GRADSYNC_SUM));
  const int sum_of_ranks = me.ranks * (me.ranks + 1) / 2;  // exact: one of the two is even
  const auto expected = static_cast<float>(sum_of_ranks);
  for (int i = 0; i < 1024; ++i) {
    if (data[i] != expected) {
      std::fprintf(stderr, "device_refused: element %d is %g, expected %g\n", i, data[i], expected);
      return 1;
    }
  }
  comm.unset_cuda_stream();
  return 0;
}

// Every collective, op and dtype, in place and out of place, checked against the reference.
int scenario_collectives(Communicator& comm, const RankIdentity& me) {
  const size_t max_count = 100003;
  SharedBuffer a = comm.allocate(max_count * 8 * static_cast<size_t>(me.ranks));
  SharedBuffer b = comm.allocate(max_count * 8 * static_cast<size_t>(me.ranks));
  uint64_t seed = 0;
  for (gradsync_dtype dtype : kDtypes) {
    const size_t element = gradsync_dtype_size(dtype);
    for (size_t count : {size_t{1}, size_t{1000}, max_count}) {
      for (gradsync_op op : kOps) {
        if (!gradsync::ipc::op_reduces(op, dtype)) continue;
        for (bool in_place : {false, true}) {
          ++seed;
          reference::fill_input(a.data(), count, dtype, me.rank, op, seed);
          void* recv = in_place ? a.data() : b.data();
          const std::string name = "ar." + std::to_string(seed);
          comm.wait(comm.allreduce(name.c_str(), a.data(), recv, count, dtype, op));
          const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, recv, count,
                                                      dtype, op, me.ranks, 0, seed);
          EXPECT_OR_FAIL(me, wrong == 0,
                         "allreduce dtype %d op %d count %zu in_place %d: %zu wrong", dtype, op,
                         count, in_place, wrong);
        }
      }
      for (int root = 0; root < me.ranks; ++root) {
        ++seed;
        reference::fill_input(a.data(), count, dtype, me.rank, GRADSYNC_SUM, seed);
        const std::string name = "bc." + std::to_string(seed);
        comm.wait(comm.broadcast(name.c_str(), a.data(), b.data(), count, dtype, root));
        const size_t wrong = reference::count_wrong(reference::Kind::kBroadcast, b.data(), count,
                                                    dtype, GRADSYNC_SUM, me.ranks, root, seed);
        EXPECT_OR_FAIL(me, wrong == 0, "broadcast root %d dtype %d count %zu: %zu wrong", root,
                       dtype, count, wrong);
      }
      for (bool in_place : {false, true}) {
        ++seed;
        auto* recv = b.as<uint8_t>();
        uint8_t* send =
            in_place ? recv + static_cast<size_t>(me.rank) * count * element : a.as<uint8_t>();
        reference::fill_input(send, count, dtype, me.rank, GRADSYNC_SUM, seed);
        const std::string name = "ag." + std::to_string(seed);
        comm.wait(comm.allgather(name.c_str(), send, recv, count, dtype));
        const size_t wrong = reference::count_wrong(reference::Kind::kAllgather, recv, count, dtype,
                                                    GRADSYNC_SUM, me.ranks, 0, seed);
        EXPECT_OR_FAIL(me, wrong == 0, "allgather dtype %d count %zu in_place %d: %zu wrong", dtype,
                       count, in_place, wrong);
      }
      for (gradsync_op op : kOps) {
        if (!gradsync::ipc::op_reduces(op, dtype)) continue;
        for (bool in_place : {false, true}) {
          ++seed;
          auto* send = a.as<uint8_t>();
          reference::fill_input(send, count * static_cast<size_t>(me.ranks), dtype, me.rank, op,
                                seed);
          uint8_t* recv =
              in_place ? send + static_cast<size_t>(me.rank) * count * element : b.as<uint8_t>();
          const std::string name = "rs." + std::to_string(seed);
          comm.wait(comm.reduce_scatter(name.c_str(), send, recv, count, dtype, op));
          const size_t wrong = reference::count_wrong_reduce_scatter(recv, count, dtype, op,
                                                                     me.ranks, me.rank, seed);
          EXPECT_OR_FAIL(me, wrong == 0,
                         "reduce-scatter dtype %d op %d count %zu in_place %d: %zu wrong", dtype,
                         op, count, in_place, wrong);
        }
      }
      ++seed;
      reference::fill_input(a.data(), count * static_cast<size_t>(me.ranks), dtype, me.rank,
                            GRADSYNC_SUM, seed);
      const std::string name = "a2a." + std::to_string(seed);
      comm.wait(comm.alltoall(name.c_str(), a.data(), b.data(), count, dtype));
      const size_t wrong = reference::count_wrong_alltoall(b.data(), count, dtype, GRADSYNC_SUM,
                                                           me.ranks, me.rank, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "all-to-all dtype %d count %zu: %zu wrong", dtype, count,
                     wrong);
    }
  }
  for (int i = 0; i < 10; ++i) comm.barrier();
  return 0;
}

// Many tensors, all in flight, submitted in a different random order on every rank.
int scenario_random_order(Communicator& comm, const RankIdentity& me) {
  constexpr size_t kTensors = 300;
  std::mt19937_64 sizes_rng(42);  // same sizes on every rank
  std::vector<size_t> counts(kTensors), offsets(kTensors);
  size_t total = 0;
  for (size_t i = 0; i < kTensors; ++i) {
    counts[i] = 1 + sizes_rng() % 20000;
    offsets[i] = total;
    total += counts[i];
  }
  SharedBuffer in = comm.allocate(total * sizeof(float));
  SharedBuffer out = comm.allocate(total * sizeof(float));
  for (size_t i = 0; i < kTensors; ++i) {
    reference::fill_input(in.as<float>() + offsets[i], counts[i], GRADSYNC_FLOAT32, me.rank,
                          GRADSYNC_SUM, i);
  }
  std::vector<size_t> order(kTensors);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 order_rng(1000 + static_cast<uint64_t>(me.rank));
  for (int step = 0; step < 3; ++step) {
    std::shuffle(order.begin(), order.end(), order_rng);
    std::vector<gradsync_request> requests(kTensors);
    for (size_t i : order) {
      const std::string name = "tensor." + std::to_string(i);
      requests[i] =
          comm.allreduce(name.c_str(), in.as<float>() + offsets[i], out.as<float>() + offsets[i],
                         counts[i], GRADSYNC_FLOAT32, GRADSYNC_SUM);
    }
    for (size_t i : order) comm.wait(requests[i]);
    for (size_t i = 0; i < kTensors; ++i) {
      const size_t wrong =
          reference::count_wrong(reference::Kind::kAllreduce, out.as<float>() + offsets[i],
                                 counts[i], GRADSYNC_FLOAT32, GRADSYNC_SUM, me.ranks, 0, i);
      EXPECT_OR_FAIL(me, wrong == 0, "step %d tensor %zu: %zu wrong", step, i, wrong);
    }
  }
  return 0;
}

// Allreduces of every dtype and op, all in flight, in a different random order on every rank:
// across nodes, runs of one dtype and op fuse, and every change of either cuts the run.
int scenario_mixed(Communicator& comm, const RankIdentity& me) {
  struct Tensor {
    gradsync_dtype dtype;
    gradsync_op op;
    size_t count;
    size_t offset;  // bytes, in both buffers
  };
  std::vector<Tensor> tensors;
  size_t total = 0;
  for (int copy = 0; copy < 3; ++copy) {
    for (gradsync_dtype dtype : kDtypes) {
      for (gradsync_op op : kOps) {
        if (!gradsync::ipc::op_reduces(op, dtype)) continue;
        const size_t count = 1500 + (tensors.size() * 331) % 4500;
        tensors.push_back({dtype, op, count, total});
        total += (count * gradsync_dtype_size(dtype) + 63) / 64 * 64;
      }
    }
  }
  SharedBuffer in = comm.allocate(total);
  SharedBuffer out = comm.allocate(total);
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 order_rng(77 + static_cast<uint64_t>(me.rank));
  for (int step = 0; step < 3; ++step) {
    std::shuffle(order.begin(), order.end(), order_rng);
    std::vector<gradsync_request> requests(tensors.size());
    for (size_t i : order) {
      const Tensor& t = tensors[i];
      const uint64_t seed = static_cast<uint64_t>(step) * tensors.size() + i + 1;
      uint8_t* send = in.as<uint8_t>() + t.offset;
      uint8_t* recv = i % 2 == 0 ? send : out.as<uint8_t>() + t.offset;  // in place or not
      reference::fill_input(send, t.count, t.dtype, me.rank, t.op, seed);
      const std::string name = "mixed." + std::to_string(i);
      requests[i] = comm.allreduce(name.c_str(), send, recv, t.count, t.dtype, t.op);
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      comm.wait(requests[i]);
      const uint64_t seed = static_cast<uint64_t>(step) * tensors.size() + i + 1;
      const uint8_t* recv = (i % 2 == 0 ? in.as<uint8_t>() : out.as<uint8_t>()) + t.offset;
      const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, recv, t.count,
                                                  t.dtype, t.op, me.ranks, 0, seed);
      EXPECT_OR_FAIL(me, wrong == 0, "step %d tensor %zu (dtype %d op %d count %zu): %zu wrong",
                     step, i, t.dtype, t.op, t.count, wrong);
    }
  }
  return 0;
}

// Gradients of very different sizes in flight together, as a model's are, all f32 of one op:
// the small ones fuse packed, the large ones (with halving-doubling) in place, each in its own
// buffer. In place and out of place alternate by tensor; sum, then average (divided block by
// block); `rounds` times over.
int scenario_fused_sizes(Communicator& comm, const RankIdentity& me, int rounds) {
  const std::vector<size_t> counts = {393217, 1, 65536,  7,    1000003, 300,
                                      131071, 2, 262147, 5000, 3,       524289};
  std::vector<size_t> offsets;  // floats, in both buffers
  size_t total = 0;
  for (const size_t count : counts) {
    offsets.push_back(total);
    total += (count + 15) / 16 * 16;
  }
  SharedBuffer in = comm.allocate(total * 4);
  SharedBuffer out = comm.allocate(total * 4);
  uint64_t seed = 500;
  for (int round = 0; round < rounds; ++round) {
    for (const gradsync_op op : {GRADSYNC_SUM, GRADSYNC_AVG}) {
      for (int step = 0; step < 2; ++step, seed += counts.size()) {
        std::vector<gradsync_request> requests(counts.size());
        for (size_t i = 0; i < counts.size(); ++i) {
          float* send = in.as<float>() + offsets[i];
          float* recv = i % 2 == 0 ? send : out.as<float>() + offsets[i];
          reference::fill_input(send, counts[i], GRADSYNC_FLOAT32, me.rank, op, seed + i);
          const std::string name = "sizes." + std::to_string(i);
          requests[i] = comm.allreduce(name.c_str(), send, recv, counts[i], GRADSYNC_FLOAT32, op);
        }
        for (size_t i = 0; i < counts.size(); ++i) {
          comm.wait(requests[i]);
          const float* recv = (i % 2 == 0 ? in.as<float>() : out.as<float>()) + offsets[i];
          const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, recv, counts[i],
                                                      GRADSYNC_FLOAT32, op, me.ranks, 0, seed + i);
          EXPECT_OR_FAIL(me, wrong == 0, "op %d step %d tensor %zu (%zu floats): %zu wrong", op,
                         step, i, counts[i], wrong);
        }
      }
    }
  }
  return 0;
}

// A group of tensors negotiated and run as one unit, between ungrouped collectives.
int scenario_grouped(Communicator& comm, const RankIdentity& me) {
  constexpr size_t kMembers = 16;
  constexpr size_t kCount = 5000;
  SharedBuffer buf = comm.allocate((kMembers + 2) * kCount * sizeof(double));
  auto* data = buf.as<double>();
  for (size_t i = 0; i < kMembers + 2; ++i) {
    reference::fill_input(data + i * kCount, kCount, GRADSYNC_FLOAT64, me.rank, GRADSYNC_MAX, i);
  }
  std::vector<gradsync_request> requests;
  requests.push_back(comm.allreduce("before", data, data, kCount, GRADSYNC_FLOAT64, GRADSYNC_MAX));
  comm.group_start();
  // Ranks list the members in different orders: the group is still one unit.
  for (size_t j = 0; j < kMembers; ++j) {
    const size_t i = me.rank % 2 == 0 ? j : kMembers - 1 - j;
    const std::string name = "group.member." + std::to_string(i);
    requests.push_back(comm.allreduce(name.c_str(), data + (i + 1) * kCount,
                                      data + (i + 1) * kCount, kCount, GRADSYNC_FLOAT64,
                                      GRADSYNC_MAX));
  }
  comm.group_end();
  requests.push_back(comm.allreduce("after", data + (kMembers + 1) * kCount,
                                    data + (kMembers + 1) * kCount, kCount, GRADSYNC_FLOAT64,
                                    GRADSYNC_MAX));
  for (auto r : requests) comm.wait(r);
  for (size_t i = 0; i < kMembers + 2; ++i) {
    const size_t wrong =
        reference::count_wrong(reference::Kind::kAllreduce, data + i * kCount, kCount,
                               GRADSYNC_FLOAT64, GRADSYNC_MAX, me.ranks, 0, i);
    EXPECT_OR_FAIL(me, wrong == 0, "tensor %zu: %zu wrong", i, wrong);
  }
  return 0;
}

// Ranks disagree on a tensor's count, then on another's priority, then on the kind of their
// first unnamed collective: every rank gets the error, naming the tensor and what differs (at
// once: unnamed collectives of every kind share one sequence); the job goes on working.
int scenario_mismatch(Communicator& comm, const RankIdentity& me) {
  SharedBuffer buf = comm.allocate(4096);
  const size_t count = me.rank == me.ranks - 1 ? 101 : 100;
  if (expect_mismatch(comm, me,
                      comm.allreduce("mismatched.tensor", buf.data(), buf.data(), count,
                                     GRADSYNC_FLOAT32, GRADSYNC_SUM),
                      "mismatched.tensor", "count") != 0) {
    return 1;
  }
  comm.set_priority(me.rank == me.ranks - 1 ? 3 : 0);
  if (expect_mismatch(comm, me,
                      comm.allreduce("prioritised.tensor", buf.data(), buf.data(), 100,
                                     GRADSYNC_FLOAT32, GRADSYNC_SUM),
                      "prioritised.tensor", "priority") != 0) {
    return 1;
  }
  comm.set_priority(0);
  const gradsync_request unnamed =
      me.rank == me.ranks - 1
          ? comm.broadcast(nullptr, buf.data(), buf.data(), 100, GRADSYNC_FLOAT32, 0)
          : comm.allreduce(nullptr, buf.data(), buf.data(), 100, GRADSYNC_FLOAT32, GRADSYNC_SUM);
  if (expect_mismatch(comm, me, unnamed, "allreduce", "broadcast") != 0) return 1;
  reference::fill_input(buf.data(), 100, GRADSYNC_FLOAT32, me.rank, GRADSYNC_SUM, 3);
  comm.wait(
      comm.allreduce("fine.tensor", buf.data(), buf.data(), 100, GRADSYNC_FLOAT32, GRADSYNC_SUM));
  EXPECT_OR_FAIL(me,
                 reference::count_wrong(reference::Kind::kAllreduce, buf.data(), 100,
                                        GRADSYNC_FLOAT32, GRADSYNC_SUM, me.ranks, 0, 3) == 0,
                 "allreduce after the mismatch is wrong");
  return 0;
}

// Large allreduces at priority 0, small ones at priorities 1 to 4 and a group whose members
// have two priorities, all in flight together, three steps: every result right while the
// daemon preempts, ages and gates (the order itself: tests/python/priority_order.py).
int scenario_priorities(Communicator& comm, const RankIdentity& me) {
  constexpr size_t kLarge = 3 << 20;  // floats: 12 MiB, three of the engine's 4 MiB pieces
  constexpr size_t kSmall = 4096;
  constexpr size_t kLarges = 3;
  constexpr size_t kSmalls = 24;
  constexpr size_t kTensors = kLarges + kSmalls;
  SharedBuffer buffer = comm.allocate((kLarges * kLarge + kSmalls * kSmall) * sizeof(float));
  auto data = [&](size_t i) {
    return buffer.as<float>() +
           (i < kLarges ? i * kLarge : kLarges * kLarge + (i - kLarges) * kSmall);
  };
  auto count = [](size_t i) { return i < kLarges ? kLarge : kSmall; };
  for (uint64_t step = 0; step < 3; ++step) {
    std::vector<gradsync_request> requests;
    for (size_t i = 0; i < kTensors; ++i) {
      reference::fill_input(data(i), count(i), GRADSYNC_FLOAT32, me.rank, GRADSYNC_SUM,
                            step * kTensors + i);
    }
    for (size_t i = 0; i < kTensors - 2; ++i) {
      comm.set_priority(i < kLarges ? 0 : static_cast<int32_t>(1 + i % 4));
      const std::string name = "prioritised." + std::to_string(i);
      requests.push_back(
          comm.allreduce(name.c_str(), data(i), data(i), count(i), GRADSYNC_FLOAT32, GRADSYNC_SUM));
    }
    comm.group_start();
    for (size_t i = kTensors - 2; i < kTensors; ++i) {
      comm.set_priority(i % 2 == 0 ? 2 : 7);
      const std::string name = "prioritised." + std::to_string(i);
      requests.push_back(
          comm.allreduce(name.c_str(), data(i), data(i), count(i), GRADSYNC_FLOAT32, GRADSYNC_SUM));
    }
    comm.group_end();
    for (auto r : requests) comm.wait(r);
    for (size_t i = 0; i < kTensors; ++i) {
      const size_t wrong =
          reference::count_wrong(reference::Kind::kAllreduce, data(i), count(i), GRADSYNC_FLOAT32,
                                 GRADSYNC_SUM, me.ranks, 0, step * kTensors + i);
      EXPECT_OR_FAIL(me, wrong == 0, "step %llu, tensor %zu: %zu wrong",
                     static_cast<unsigned long long>(step), i, wrong);
    }
  }
  comm.set_priority(0);
  return 0;
}

}  // namespace gradsync::testing
