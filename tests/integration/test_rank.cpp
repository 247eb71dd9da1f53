// gradsync-test-rank: one rank of an integration test, a real client process. Identity comes
// from the environment, as for any rank. The scenario is argv[1]; the exit status is the result
// (0: every check passed; for the fault scenarios, the gradsync_result the rank ended with).
#include "ipc/protocol.h"
#include "tests/integration/parts_scenario.h"
#include "tests/integration/topk_scenario.h"
#include "tools/common/reference.h"

#include <gradsync/gradsync.hpp>

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using gradsync::Communicator;
using gradsync::SharedBuffer;
namespace reference = gradsync::reference;

int g_rank = 0;
int g_ranks = 1;
// The scenarios of small and large collectives of one kind take "unnamed" (or "named") after
// their step count: unnamed, they submit without names, as the torch.distributed backend does.
bool g_unnamed = false;

const char* name_or_none(const char* name) {
  return g_unnamed ? nullptr : name;
}

#define EXPECT_OR_FAIL(cond, ...)                                           \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                    \
      std::fprintf(stderr, "\n");                                           \
      return 1;                                                             \
    }                                                                       \
  } while (0)

const gradsync_dtype kDtypes[] = {GRADSYNC_FLOAT32,  GRADSYNC_FLOAT64, GRADSYNC_FLOAT16,
                                  GRADSYNC_BFLOAT16, GRADSYNC_INT32,   GRADSYNC_INT64};
// Each op with the dtypes it reduces (ipc::op_reduces: the bitwise ops take the integers).
const gradsync_op kOps[] = {GRADSYNC_SUM,  GRADSYNC_AVG,  GRADSYNC_MIN, GRADSYNC_MAX,
                            GRADSYNC_PROD, GRADSYNC_BAND, GRADSYNC_BOR, GRADSYNC_BXOR};

// Every collective, op and dtype, in place and out of place, checked against the reference.
// Host memory offered as device memory through the C++ wrapper: refused (no driver, or not
// device memory), and the communicator goes on serving host memory.
int scenario_device_refused(Communicator& comm) {
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
  for (int i = 0; i < 1024; ++i) data[i] = static_cast<float>(g_rank + 1);
  comm.wait(comm.allreduce("after-refusal", data, data, 1024, GRADSYNC_FLOAT32, GRADSYNC_SUM));
  const int sum_of_ranks = g_ranks * (g_ranks + 1) / 2;  // exact: one of the two is even
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

int scenario_collectives(Communicator& comm) {
  const size_t max_count = 100003;
  SharedBuffer a = comm.allocate(max_count * 8 * static_cast<size_t>(g_ranks));
  SharedBuffer b = comm.allocate(max_count * 8 * static_cast<size_t>(g_ranks));
  uint64_t seed = 0;
  for (gradsync_dtype dtype : kDtypes) {
    const size_t element = gradsync_dtype_size(dtype);
    for (size_t count : {size_t{1}, size_t{1000}, max_count}) {
      for (gradsync_op op : kOps) {
        if (!gradsync::ipc::op_reduces(op, dtype)) continue;
        for (bool in_place : {false, true}) {
          ++seed;
          reference::fill_input(a.data(), count, dtype, g_rank, op, seed);
          void* recv = in_place ? a.data() : b.data();
          const std::string name = "ar." + std::to_string(seed);
          comm.wait(comm.allreduce(name.c_str(), a.data(), recv, count, dtype, op));
          const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, recv, count,
                                                      dtype, op, g_ranks, 0, seed);
          EXPECT_OR_FAIL(wrong == 0, "allreduce dtype %d op %d count %zu in_place %d: %zu wrong",
                         dtype, op, count, in_place, wrong);
        }
      }
      for (int root = 0; root < g_ranks; ++root) {
        ++seed;
        reference::fill_input(a.data(), count, dtype, g_rank, GRADSYNC_SUM, seed);
        const std::string name = "bc." + std::to_string(seed);
        comm.wait(comm.broadcast(name.c_str(), a.data(), b.data(), count, dtype, root));
        const size_t wrong = reference::count_wrong(reference::Kind::kBroadcast, b.data(), count,
                                                    dtype, GRADSYNC_SUM, g_ranks, root, seed);
        EXPECT_OR_FAIL(wrong == 0, "broadcast root %d dtype %d count %zu: %zu wrong", root, dtype,
                       count, wrong);
      }
      for (bool in_place : {false, true}) {
        ++seed;
        auto* recv = b.as<uint8_t>();
        uint8_t* send =
            in_place ? recv + static_cast<size_t>(g_rank) * count * element : a.as<uint8_t>();
        reference::fill_input(send, count, dtype, g_rank, GRADSYNC_SUM, seed);
        const std::string name = "ag." + std::to_string(seed);
        comm.wait(comm.allgather(name.c_str(), send, recv, count, dtype));
        const size_t wrong = reference::count_wrong(reference::Kind::kAllgather, recv, count, dtype,
                                                    GRADSYNC_SUM, g_ranks, 0, seed);
        EXPECT_OR_FAIL(wrong == 0, "allgather dtype %d count %zu in_place %d: %zu wrong", dtype,
                       count, in_place, wrong);
      }
      for (gradsync_op op : kOps) {
        if (!gradsync::ipc::op_reduces(op, dtype)) continue;
        for (bool in_place : {false, true}) {
          ++seed;
          auto* send = a.as<uint8_t>();
          reference::fill_input(send, count * static_cast<size_t>(g_ranks), dtype, g_rank, op,
                                seed);
          uint8_t* recv =
              in_place ? send + static_cast<size_t>(g_rank) * count * element : b.as<uint8_t>();
          const std::string name = "rs." + std::to_string(seed);
          comm.wait(comm.reduce_scatter(name.c_str(), send, recv, count, dtype, op));
          const size_t wrong =
              reference::count_wrong_reduce_scatter(recv, count, dtype, op, g_ranks, g_rank, seed);
          EXPECT_OR_FAIL(wrong == 0,
                         "reduce-scatter dtype %d op %d count %zu in_place %d: %zu wrong", dtype,
                         op, count, in_place, wrong);
        }
      }
      ++seed;
      reference::fill_input(a.data(), count * static_cast<size_t>(g_ranks), dtype, g_rank,
                            GRADSYNC_SUM, seed);
      const std::string name = "a2a." + std::to_string(seed);
      comm.wait(comm.alltoall(name.c_str(), a.data(), b.data(), count, dtype));
      const size_t wrong = reference::count_wrong_alltoall(b.data(), count, dtype, GRADSYNC_SUM,
                                                           g_ranks, g_rank, seed);
      EXPECT_OR_FAIL(wrong == 0, "all-to-all dtype %d count %zu: %zu wrong", dtype, count, wrong);
    }
  }
  for (int i = 0; i < 10; ++i) comm.barrier();
  return 0;
}

// Many tensors, all in flight, submitted in a different random order on every rank.
int scenario_random_order(Communicator& comm) {
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
    reference::fill_input(in.as<float>() + offsets[i], counts[i], GRADSYNC_FLOAT32, g_rank,
                          GRADSYNC_SUM, i);
  }
  std::vector<size_t> order(kTensors);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 order_rng(1000 + static_cast<uint64_t>(g_rank));
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
                                 counts[i], GRADSYNC_FLOAT32, GRADSYNC_SUM, g_ranks, 0, i);
      EXPECT_OR_FAIL(wrong == 0, "step %d tensor %zu: %zu wrong", step, i, wrong);
    }
  }
  return 0;
}

// Allreduces of every dtype and op, all in flight, in a different random order on every rank:
// across nodes, runs of one dtype and op fuse, and every change of either cuts the run.
int scenario_mixed(Communicator& comm) {
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
  std::mt19937_64 order_rng(77 + static_cast<uint64_t>(g_rank));
  for (int step = 0; step < 3; ++step) {
    std::shuffle(order.begin(), order.end(), order_rng);
    std::vector<gradsync_request> requests(tensors.size());
    for (size_t i : order) {
      const Tensor& t = tensors[i];
      const uint64_t seed = static_cast<uint64_t>(step) * tensors.size() + i + 1;
      uint8_t* send = in.as<uint8_t>() + t.offset;
      uint8_t* recv = i % 2 == 0 ? send : out.as<uint8_t>() + t.offset;  // in place or not
      reference::fill_input(send, t.count, t.dtype, g_rank, t.op, seed);
      const std::string name = "mixed." + std::to_string(i);
      requests[i] = comm.allreduce(name.c_str(), send, recv, t.count, t.dtype, t.op);
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      comm.wait(requests[i]);
      const uint64_t seed = static_cast<uint64_t>(step) * tensors.size() + i + 1;
      const uint8_t* recv = (i % 2 == 0 ? in.as<uint8_t>() : out.as<uint8_t>()) + t.offset;
      const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, recv, t.count,
                                                  t.dtype, t.op, g_ranks, 0, seed);
      EXPECT_OR_FAIL(wrong == 0, "step %d tensor %zu (dtype %d op %d count %zu): %zu wrong", step,
                     i, t.dtype, t.op, t.count, wrong);
    }
  }
  return 0;
}

// Gradients of very different sizes in flight together, as a model's are, all f32 of one op:
// the small ones fuse packed, the large ones (with halving-doubling) in place, each in its own
// buffer. In place and out of place alternate by tensor; sum, then average (divided block by
// block); `rounds` times over.
int scenario_fused_sizes(Communicator& comm, int rounds) {
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
          reference::fill_input(send, counts[i], GRADSYNC_FLOAT32, g_rank, op, seed + i);
          const std::string name = "sizes." + std::to_string(i);
          requests[i] = comm.allreduce(name.c_str(), send, recv, counts[i], GRADSYNC_FLOAT32, op);
        }
        for (size_t i = 0; i < counts.size(); ++i) {
          comm.wait(requests[i]);
          const float* recv = (i % 2 == 0 ? in.as<float>() : out.as<float>()) + offsets[i];
          const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, recv, counts[i],
                                                      GRADSYNC_FLOAT32, op, g_ranks, 0, seed + i);
          EXPECT_OR_FAIL(wrong == 0, "op %d step %d tensor %zu (%zu floats): %zu wrong", op, step,
                         i, counts[i], wrong);
        }
      }
    }
  }
  return 0;
}

// The first `submitters` ranks submit a tensor the other ranks withhold (they sleep until
// killed): the daemon's stall inspector must name it and them, and with stall_shutdown_seconds
// fail the job with that message (a submitter then exits 0 if it got a timeout naming the
// tensor and `missing`).
int scenario_withhold(Communicator& comm, const std::string& missing, int submitters) {
  SharedBuffer buf = comm.allocate(4096);
  if (g_rank >= submitters) {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  const gradsync_request r =
      comm.allreduce("withheld.tensor", buf.data(), buf.data(), 16, GRADSYNC_FLOAT32, GRADSYNC_SUM);
  const gradsync_result result = gradsync_wait(comm.get(), r);
  const std::string message = gradsync_last_error(comm.get());
  std::printf("%d %s\n", result, message.c_str());
  // With several nodes submitting, the first to give up fails the job on the others too.
  EXPECT_OR_FAIL(
      result == GRADSYNC_ERR_TIMEOUT || (submitters > 1 && result == GRADSYNC_ERR_PEER_FAILED),
      "expected a timeout, got %d (%s)", result, message.c_str());
  EXPECT_OR_FAIL(message.find("withheld.tensor") != std::string::npos &&
                     message.find(missing) != std::string::npos,
                 "the message does not name the tensor and '%s': %s", missing.c_str(),
                 message.c_str());
  return 0;
}

// Rank 0 submits a tensor the other ranks withhold (they sleep until killed) and asks the daemon
// what its job waits for: nothing at first, nor just after (ranks submit a moment apart: a
// stall has waited a second), then the tensor and `missing`, within 10 s.
int scenario_waiting_for(Communicator& comm, const std::string& missing) {
  SharedBuffer buf = comm.allocate(4096);
  if (g_rank != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  const std::string before = comm.waiting_for();
  EXPECT_OR_FAIL(before.empty(), "the job waits for something before any submission: %s",
                 before.c_str());
  const auto submitted = std::chrono::steady_clock::now();
  comm.allreduce("withheld.tensor", buf.data(), buf.data(), 16, GRADSYNC_FLOAT32, GRADSYNC_SUM);
  const std::string just_after = comm.waiting_for();
  // Only where the answer came well within the second can it be held to that.
  if (std::chrono::steady_clock::now() - submitted < std::chrono::milliseconds(500)) {
    EXPECT_OR_FAIL(just_after.empty(), "a collective submitted a moment ago is a stall: %s",
                   just_after.c_str());
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string waiting;
  // Until the other nodes' reports of the cycle arrive, the daemon knows only that it waits
  // for "the other nodes"; then it names those that have not submitted.
  while (std::chrono::steady_clock::now() < deadline) {
    waiting = comm.waiting_for();
    if (waiting.find("withheld.tensor") != std::string::npos &&
        waiting.find(missing) != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("waiting for: %s\n", waiting.c_str());
  EXPECT_OR_FAIL(waiting.find("withheld.tensor") != std::string::npos &&
                     waiting.find(missing) != std::string::npos,
                 "the daemon's answer does not name the tensor and '%s': %s", missing.c_str(),
                 waiting.c_str());
  EXPECT_OR_FAIL(waiting.find("has waited 0 s") == std::string::npos,
                 "a stall younger than a second was reported: %s", waiting.c_str());
  // A buffer too small for the answer gets as much of it as fits.
  char small[8];
  EXPECT_OR_FAIL(gradsync_waiting_for(comm.get(), small, sizeof(small)) == GRADSYNC_OK &&
                     std::strlen(small) == sizeof(small) - 1,
                 "a short buffer did not get the answer cut short: '%s'", small);
  return 0;  // with the request in flight: the rank leaves, as a rank that gives up would
}

// A group of tensors negotiated and run as one unit, between ungrouped collectives.
int scenario_grouped(Communicator& comm) {
  constexpr size_t kMembers = 16;
  constexpr size_t kCount = 5000;
  SharedBuffer buf = comm.allocate((kMembers + 2) * kCount * sizeof(double));
  auto* data = buf.as<double>();
  for (size_t i = 0; i < kMembers + 2; ++i) {
    reference::fill_input(data + i * kCount, kCount, GRADSYNC_FLOAT64, g_rank, GRADSYNC_MAX, i);
  }
  std::vector<gradsync_request> requests;
  requests.push_back(comm.allreduce("before", data, data, kCount, GRADSYNC_FLOAT64, GRADSYNC_MAX));
  comm.group_start();
  // Ranks list the members in different orders: the group is still one unit.
  for (size_t j = 0; j < kMembers; ++j) {
    const size_t i = g_rank % 2 == 0 ? j : kMembers - 1 - j;
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
                               GRADSYNC_FLOAT64, GRADSYNC_MAX, g_ranks, 0, i);
    EXPECT_OR_FAIL(wrong == 0, "tensor %zu: %zu wrong", i, wrong);
  }
  return 0;
}

// Waits for `request`, which must fail as a mismatch whose message holds both words.
int expect_mismatch(Communicator& comm, gradsync_request request, const char* first,
                    const char* second) {
  const gradsync_result result = gradsync_wait(comm.get(), request);
  const std::string message = gradsync_last_error(comm.get());
  EXPECT_OR_FAIL(result == GRADSYNC_ERR_MISMATCH, "expected a mismatch, got %d (%s)", result,
                 message.c_str());
  EXPECT_OR_FAIL(
      message.find(first) != std::string::npos && message.find(second) != std::string::npos,
      "message does not name %s and %s: %s", first, second, message.c_str());
  return 0;
}

// Ranks disagree on a tensor's count, then on another's priority, then on the kind of their
// first unnamed collective: every rank gets the error, naming the tensor and what differs (at
// once: unnamed collectives of every kind share one sequence); the job goes on working.
int scenario_mismatch(Communicator& comm) {
  SharedBuffer buf = comm.allocate(4096);
  const size_t count = g_rank == g_ranks - 1 ? 101 : 100;
  if (expect_mismatch(comm,
                      comm.allreduce("mismatched.tensor", buf.data(), buf.data(), count,
                                     GRADSYNC_FLOAT32, GRADSYNC_SUM),
                      "mismatched.tensor", "count") != 0) {
    return 1;
  }
  comm.set_priority(g_rank == g_ranks - 1 ? 3 : 0);
  if (expect_mismatch(comm,
                      comm.allreduce("prioritised.tensor", buf.data(), buf.data(), 100,
                                     GRADSYNC_FLOAT32, GRADSYNC_SUM),
                      "prioritised.tensor", "priority") != 0) {
    return 1;
  }
  comm.set_priority(0);
  const gradsync_request unnamed =
      g_rank == g_ranks - 1
          ? comm.broadcast(nullptr, buf.data(), buf.data(), 100, GRADSYNC_FLOAT32, 0)
          : comm.allreduce(nullptr, buf.data(), buf.data(), 100, GRADSYNC_FLOAT32, GRADSYNC_SUM);
  if (expect_mismatch(comm, unnamed, "allreduce", "broadcast") != 0) return 1;
  reference::fill_input(buf.data(), 100, GRADSYNC_FLOAT32, g_rank, GRADSYNC_SUM, 3);
  comm.wait(
      comm.allreduce("fine.tensor", buf.data(), buf.data(), 100, GRADSYNC_FLOAT32, GRADSYNC_SUM));
  EXPECT_OR_FAIL(reference::count_wrong(reference::Kind::kAllreduce, buf.data(), 100,
                                        GRADSYNC_FLOAT32, GRADSYNC_SUM, g_ranks, 0, 3) == 0,
                 "allreduce after the mismatch is wrong");
  return 0;
}

// Large allreduces at priority 0, small ones at priorities 1 to 4 and a group whose members
// have two priorities, all in flight together, three steps: every result right while the
// daemon preempts, ages and gates (the order itself: tests/python/priority_order.py).
int scenario_priorities(Communicator& comm) {
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
      reference::fill_input(data(i), count(i), GRADSYNC_FLOAT32, g_rank, GRADSYNC_SUM,
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
                                 GRADSYNC_SUM, g_ranks, 0, step * kTensors + i);
      EXPECT_OR_FAIL(wrong == 0, "step %llu, tensor %zu: %zu wrong",
                     static_cast<unsigned long long>(step), i, wrong);
    }
  }
  comm.set_priority(0);
  return 0;
}

// Across nodes: allreduce for every dtype and op, counts below and not divisible by the node
// count, then every collective, many tensors in per-rank random order, groups and barriers.
int scenario_cluster(Communicator& comm) {
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
          reference::fill_input(a.data(), count, dtype, g_rank, op, seed);
          const std::string name =
              "c." + std::to_string(dtype) + "." + std::to_string(count) + "." + std::to_string(op);
          comm.wait(comm.allreduce(name.c_str(), a.data(), b.data(), count, dtype, op));
          const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, b.data(), count,
                                                      dtype, op, g_ranks, 0, seed);
          EXPECT_OR_FAIL(wrong == 0, "allreduce dtype %d op %d count %zu: %zu wrong", dtype, op,
                         count, wrong);
        }
      }
    }
  }
  for (int i = 0; i < 5; ++i) comm.barrier();
  if (const int failed = scenario_collectives(comm); failed != 0) return failed;
  if (const int failed = scenario_random_order(comm); failed != 0) return failed;
  return scenario_grouped(comm);
}

// Training-shaped: `steps` steps of the same `tensors` gradient names (1 to `max_count` floats
// each), submitted in a different order on every rank and step, then waited for and checked.
// After the first step every name is in the daemons' response cache (when they have one).
int scenario_steps(Communicator& comm, int steps, size_t tensors, size_t max_count) {
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
  std::mt19937 random(static_cast<unsigned>(g_rank) * 7 + 1);
  std::vector<size_t> order(kTensors);
  std::iota(order.begin(), order.end(), 0);
  for (int step = 0; step < steps; ++step) {
    std::shuffle(order.begin(), order.end(), random);
    std::vector<gradsync_request> requests(kTensors);
    for (size_t i : order) {
      const uint64_t seed = static_cast<uint64_t>(step) * kTensors + i + 1;
      reference::fill_input(data + offsets[i], counts[i], GRADSYNC_FLOAT32, g_rank, GRADSYNC_SUM,
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
                                 GRADSYNC_FLOAT32, GRADSYNC_SUM, g_ranks, 0, seed);
      EXPECT_OR_FAIL(wrong == 0, "step %d tensor %zu: %zu wrong", step, i, wrong);
    }
  }
  return 0;
}

// `steps` steps of the same allgathers: two small ones (which piggyback on the
// negotiation) and a large one (over the network), out of place and in place,
// each checked against the reference.
int scenario_allgathers(Communicator& comm, int steps) {
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
  const size_t most = 100003 * sizeof(float) * static_cast<size_t>(g_ranks);
  SharedBuffer send_buffer = comm.allocate(most);
  SharedBuffer recv_buffer = comm.allocate(most);
  uint64_t seed = 0;
  for (int step = 0; step < steps; ++step) {
    for (const Gathered& g : gathered) {
      ++seed;
      const size_t block = g.count * gradsync_dtype_size(g.dtype);
      auto* recv = recv_buffer.as<uint8_t>();
      uint8_t* send =
          g.in_place ? recv + static_cast<size_t>(g_rank) * block : send_buffer.as<uint8_t>();
      reference::fill_input(send, g.count, g.dtype, g_rank, GRADSYNC_SUM, seed);
      comm.wait(comm.allgather(name_or_none(g.name), send, recv, g.count, g.dtype));
      const size_t wrong = reference::count_wrong(reference::Kind::kAllgather, recv, g.count,
                                                  g.dtype, GRADSYNC_SUM, g_ranks, 0, seed);
      EXPECT_OR_FAIL(wrong == 0, "step %d allgather %s: %zu wrong", step, g.name, wrong);
    }
  }
  return 0;
}

// `steps` steps of the same reduce-scatters: a small one (which piggybacks on the
// negotiation) and large ones (over the network, in pipelined pieces, with a
// count no piece size divides), out of place and in place, sum and average, each checked
// against the reference; then `hold_ms` idle (arguments: STEPS [unnamed|named] [HOLD_MS]).
int scenario_reduce_scatters(Communicator& comm, int steps, int hold_ms) {
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
  const size_t most = 1500007 * sizeof(float) * static_cast<size_t>(g_ranks);
  SharedBuffer send_buffer = comm.allocate(most);
  SharedBuffer recv_buffer = comm.allocate(most);
  uint64_t seed = 0;
  for (int step = 0; step < steps; ++step) {
    for (const Scattered& r : scattered) {
      ++seed;
      const size_t block = r.count * gradsync_dtype_size(r.dtype);
      auto* send = send_buffer.as<uint8_t>();
      uint8_t* recv =
          r.in_place ? send + static_cast<size_t>(g_rank) * block : recv_buffer.as<uint8_t>();
      reference::fill_input(send, r.count * static_cast<size_t>(g_ranks), r.dtype, g_rank, r.op,
                            seed);
      comm.wait(comm.reduce_scatter(name_or_none(r.name), send, recv, r.count, r.dtype, r.op));
      const size_t wrong = reference::count_wrong_reduce_scatter(recv, r.count, r.dtype, r.op,
                                                                 g_ranks, g_rank, seed);
      EXPECT_OR_FAIL(wrong == 0, "step %d reduce-scatter %s: %zu wrong", step, r.name, wrong);
    }
  }
  // The job stays, idle, for whoever inspects the daemons.
  std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  return 0;
}

// `steps` steps of the same all-to-alls: a small one (which piggybacks on the
// negotiation), a large one (a stream between each pair of nodes) and an
// empty one, each checked against the reference.
int scenario_alltoalls(Communicator& comm, int steps) {
  struct Exchanged {
    const char* name;
    gradsync_dtype dtype;
    size_t count;  // per block
  };
  const Exchanged exchanged[] = {{"a2a.small", GRADSYNC_INT32, 3},
                                 {"a2a.large", GRADSYNC_FLOAT64, 300007},
                                 {"a2a.empty", GRADSYNC_INT32, 0}};
  const size_t most = 300007 * sizeof(double) * static_cast<size_t>(g_ranks);
  SharedBuffer send_buffer = comm.allocate(most);
  SharedBuffer recv_buffer = comm.allocate(most);
  uint64_t seed = 0;
  for (int step = 0; step < steps; ++step) {
    for (const Exchanged& x : exchanged) {
      ++seed;
      reference::fill_input(send_buffer.data(), x.count * static_cast<size_t>(g_ranks), x.dtype,
                            g_rank, GRADSYNC_SUM, seed);
      comm.wait(comm.alltoall(name_or_none(x.name), send_buffer.data(), recv_buffer.data(), x.count,
                              x.dtype));
      const size_t wrong = reference::count_wrong_alltoall(recv_buffer.data(), x.count, x.dtype,
                                                           GRADSYNC_SUM, g_ranks, g_rank, seed);
      EXPECT_OR_FAIL(wrong == 0, "step %d all-to-all %s: %zu wrong", step, x.name, wrong);
    }
  }
  return 0;
}

// Allreduces big enough that the inter-node algorithms cut them into pipelined pieces
// (cost_model.h: kPipelinePieceBytes per node's share), with a count no node count divides:
// out of place and in place, sum and average, each checked against the reference.
int scenario_large(Communicator& comm, size_t count) {
  SharedBuffer a = comm.allocate(count * 4);
  SharedBuffer b = comm.allocate(count * 4);
  uint64_t seed = 1000;
  for (const gradsync_op op : {GRADSYNC_SUM, GRADSYNC_AVG}) {
    for (const bool in_place : {false, true}) {
      ++seed;
      reference::fill_input(a.data(), count, GRADSYNC_FLOAT32, g_rank, op, seed);
      void* out = in_place ? a.data() : b.data();
      comm.wait(comm.allreduce("large", a.data(), out, count, GRADSYNC_FLOAT32, op));
      const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, out, count,
                                                  GRADSYNC_FLOAT32, op, g_ranks, 0, seed);
      EXPECT_OR_FAIL(wrong == 0, "allreduce of %zu floats, op %d, %s: %zu wrong", count, op,
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
int scenario_node_order(Communicator& comm, int ranks_per_node) {
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
    inputs.reserve(static_cast<size_t>(g_ranks));
    for (int rank = 0; rank < g_ranks; ++rank) inputs.push_back(input(rank, t, counts[t]));
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
    const std::vector<float> mine = input(g_rank, t, counts[t]);
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
      EXPECT_OR_FAIL(differ == 0, "%s: tensor %zu of %zu floats: %zu not the node-order sum", how,
                     t, counts[t], differ);
    }
  }
  return 0;
}

// Broadcasts of `count` floats from every root, out of place and in place (the root's buffer
// is its result), each checked against the reference: large enough, the nodes pass them along
// a chain in pieces (cost_model.h).
int scenario_broadcasts(Communicator& comm, size_t count) {
  SharedBuffer a = comm.allocate(count * 4);
  SharedBuffer b = comm.allocate(count * 4);
  uint64_t seed = 2000;
  for (int root = 0; root < g_ranks; ++root) {
    for (const bool in_place : {false, true}) {
      ++seed;
      reference::fill_input(a.data(), count, GRADSYNC_FLOAT32, g_rank, GRADSYNC_SUM, seed);
      void* out = in_place && g_rank == root ? a.data() : b.data();
      comm.wait(comm.broadcast("big", a.data(), out, count, GRADSYNC_FLOAT32, root));
      const size_t wrong =
          reference::count_wrong(reference::Kind::kBroadcast, out, count, GRADSYNC_FLOAT32,
                                 GRADSYNC_SUM, g_ranks, root, seed);
      EXPECT_OR_FAIL(wrong == 0, "broadcast of %zu floats from rank %d, %s: %zu wrong", count, root,
                     in_place ? "in place" : "out of place", wrong);
    }
  }
  return 0;
}

// Small broadcasts from every root, each root's under names of its own (a name's root is part
// of its signature), out of place and in place, and a large one that does not piggyback; `steps`
// times, every result against the reference.
int scenario_small_broadcasts(Communicator& comm, int steps) {
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
    for (int root = 0; root < g_ranks; ++root) {
      for (const Broadcast& bc : broadcasts) {
        ++seed;
        const std::string name = std::string(bc.name) + ".from" + std::to_string(root);
        reference::fill_input(a.data(), bc.count, bc.dtype, g_rank, GRADSYNC_SUM, seed);
        void* out = bc.in_place && g_rank == root ? a.data() : b.data();
        comm.wait(
            comm.broadcast(name_or_none(name.c_str()), a.data(), out, bc.count, bc.dtype, root));
        const size_t wrong = reference::count_wrong(reference::Kind::kBroadcast, out, bc.count,
                                                    bc.dtype, GRADSYNC_SUM, g_ranks, root, seed);
        EXPECT_OR_FAIL(wrong == 0, "step %d broadcast %s: %zu wrong", step, name.c_str(), wrong);
      }
    }
  }
  return 0;
}

// f32 allreduces through the bf16 wire codec (GRADSYNC_WIRE_CODEC=bf16) on inputs bf16 cannot
// hold: every element within the codec's error of the exact result, every element a bf16
// value (the result travelled encoded, and the node that finished it kept what it sent), and
// every rank's result the same to the bit (their hashes gathered through gradsync).
int scenario_encoded(Communicator& comm, size_t count) {
  SharedBuffer in = comm.allocate(count * 4);
  SharedBuffer out = comm.allocate(count * 4);
  SharedBuffer own_hash = comm.allocate(8);
  SharedBuffer hashes = comm.allocate(static_cast<size_t>(g_ranks) * 8);
  auto input = [](int rank, size_t i) {
    return static_cast<float>(1.0 + 0.001 * static_cast<double>((rank + 1) * (i % 997)) +
                              static_cast<double>(rank) / 3.0);
  };
  auto* sent = static_cast<float*>(in.data());
  for (size_t i = 0; i < count; ++i) sent[i] = input(g_rank, i);
  for (const gradsync_op op : {GRADSYNC_SUM, GRADSYNC_AVG, GRADSYNC_MAX}) {
    comm.wait(comm.allreduce("encoded", in.data(), out.data(), count, GRADSYNC_FLOAT32, op));
    const auto* got = static_cast<const float*>(out.data());
    for (size_t i = 0; i < count; ++i) {
      double exact = op == GRADSYNC_MAX ? -1e300 : 0;
      double magnitude = 0;
      for (int r = 0; r < g_ranks; ++r) {
        const double x = input(r, i);
        exact = op == GRADSYNC_MAX ? std::max(exact, x) : exact + x;
        magnitude += std::abs(x);
      }
      if (op == GRADSYNC_AVG) {
        exact /= g_ranks;
        magnitude /= g_ranks;
      }
      // One rounding to bf16's 8 significant bits (relative error <= 2^-8) of a partial sum
      // per node (a ring's hops, or each node's push to an aggregator) and one at the end.
      const double bound = (g_ranks + 1) * std::ldexp(magnitude, -8);
      EXPECT_OR_FAIL(std::abs(got[i] - exact) <= bound,
                     "op %d element %zu: %.9g, exact %.9g (bound %.3g)", op, i, got[i], exact,
                     bound);
      EXPECT_OR_FAIL((std::bit_cast<uint32_t>(got[i]) & 0xffffu) == 0,
                     "op %d element %zu: %.9g is no bf16 value", op, i, got[i]);
    }
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the result's bytes
    for (size_t b = 0; b < count * 4; ++b) {
      hash = (hash ^ static_cast<const uint8_t*>(out.data())[b]) * 1099511628211ull;
    }
    std::memcpy(own_hash.data(), &hash, sizeof(hash));
    comm.wait(comm.allgather("encoded.hash", own_hash.data(), hashes.data(), 1, GRADSYNC_INT64));
    const auto* all = static_cast<const uint64_t*>(hashes.data());
    for (int r = 0; r < g_ranks; ++r) {
      EXPECT_OR_FAIL(all[r] == all[0], "op %d: rank %d's result differs from rank 0's", op, r);
    }
  }
  // The codec is for f32: the other dtypes' results stay exact.
  uint64_t seed = 77;
  for (const gradsync_dtype dtype : {GRADSYNC_FLOAT64, GRADSYNC_BFLOAT16, GRADSYNC_INT32}) {
    const size_t elements = count * 4 / gradsync_dtype_size(dtype);
    reference::fill_input(in.data(), elements, dtype, g_rank, GRADSYNC_SUM, ++seed);
    comm.wait(
        comm.allreduce("encoded.other", in.data(), out.data(), elements, dtype, GRADSYNC_SUM));
    const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, out.data(), elements,
                                                dtype, GRADSYNC_SUM, g_ranks, 0, seed);
    EXPECT_OR_FAIL(wrong == 0, "dtype %d with the codec asked for: %zu wrong", dtype, wrong);
  }
  return 0;
}

// gradsync_wait_timeout: rank 0's allreduce is still in flight after a short wait while the
// other ranks hold theirs back (IN_PROGRESS, the request still valid), then completes.
int scenario_wait_timeout(Communicator& comm) {
  constexpr size_t kCount = 1000;
  SharedBuffer buf = comm.allocate(kCount * sizeof(float));
  auto* data = buf.as<float>();
  reference::fill_input(data, kCount, GRADSYNC_FLOAT32, g_rank, GRADSYNC_SUM, 0);
  if (g_rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  const gradsync_request r =
      comm.allreduce("held", data, data, kCount, GRADSYNC_FLOAT32, GRADSYNC_SUM);
  if (g_rank == 0) {
    const gradsync_result negative = gradsync_wait_timeout(comm.get(), r, -1);
    EXPECT_OR_FAIL(negative == GRADSYNC_ERR_INVALID_ARGUMENT, "a negative timeout gave %s",
                   gradsync_result_string(negative));
    if (g_ranks > 1) {
      const gradsync_result early = gradsync_wait_timeout(comm.get(), r, 50);
      EXPECT_OR_FAIL(early == GRADSYNC_IN_PROGRESS, "a wait before the others submitted gave %s",
                     gradsync_result_string(early));
    }
  }
  const gradsync_result done = gradsync_wait_timeout(comm.get(), r, 60'000);
  EXPECT_OR_FAIL(done == GRADSYNC_OK, "the wait gave %s: %s", gradsync_result_string(done),
                 gradsync_last_error(comm.get()));
  const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, data, kCount,
                                              GRADSYNC_FLOAT32, GRADSYNC_SUM, g_ranks, 0, 0);
  EXPECT_OR_FAIL(wrong == 0, "%zu wrong", wrong);
  return 0;
}

// Allreduce in a loop until something fails; the exit status is the failure's result code.
// `polling` waits with gradsync_test instead of gradsync_wait.
int scenario_loop(Communicator& comm, size_t bytes, bool polling, bool broadcast) {
  SharedBuffer buf = comm.allocate(bytes);
  std::printf("ready\n");
  std::fflush(stdout);
  while (true) {
    gradsync_request r = 0;
    gradsync_result result =
        broadcast ? gradsync_broadcast(comm.get(), "loop", buf.data(), buf.data(), bytes / 4,
                                       GRADSYNC_FLOAT32, 0, &r)
                  : gradsync_allreduce(comm.get(), "loop", buf.data(), buf.data(), bytes / 4,
                                       GRADSYNC_FLOAT32, GRADSYNC_SUM, &r);
    if (result == GRADSYNC_OK && polling) {
      do {
        result = gradsync_test(comm.get(), r);
      } while (result == GRADSYNC_IN_PROGRESS);
    } else if (result == GRADSYNC_OK) {
      result = gradsync_wait(comm.get(), r);
    }
    if (result != GRADSYNC_OK) {
      std::printf("rank %d: loop ended: %s: %s\n", g_rank, gradsync_result_string(result),
                  gradsync_last_error(comm.get()));
      return static_cast<int>(result);
    }
  }
}

}  // namespace

// The node's group and the across-nodes group of this rank (gradsync_options_node_group and
// gradsync_options_across_nodes_group): each group's place is as the layout says, and an
// allreduce in the node's group, then of its result in the across-nodes group, is the whole
// job's allreduce.
int scenario_groups(const gradsync_options& job) {
  gradsync_options node{};
  gradsync_options across{};
  EXPECT_OR_FAIL(gradsync_options_node_group(&job, &node) == GRADSYNC_OK, "node group: %s",
                 gradsync_last_error(nullptr));
  EXPECT_OR_FAIL(gradsync_options_across_nodes_group(&job, &across) == GRADSYNC_OK,
                 "across-nodes group: %s", gradsync_last_error(nullptr));
  const int nodes = job.world_size / job.local_world_size;
  EXPECT_OR_FAIL(node.rank == job.local_rank && node.world_size == job.local_world_size,
                 "node group: rank %d of %d", node.rank, node.world_size);
  EXPECT_OR_FAIL(across.rank == job.rank / job.local_world_size && across.world_size == nodes,
                 "across-nodes group: rank %d of %d", across.rank, across.world_size);
  Communicator node_comm(node);
  Communicator across_comm(across);
  constexpr size_t kCount = 100003;
  SharedBuffer mine = node_comm.allocate(kCount * sizeof(int32_t));
  SharedBuffer node_sum = node_comm.allocate(kCount * sizeof(int32_t));
  SharedBuffer to_send = across_comm.allocate(kCount * sizeof(int32_t));
  SharedBuffer total = across_comm.allocate(kCount * sizeof(int32_t));
  auto* values = static_cast<int32_t*>(mine.data());
  for (size_t i = 0; i < kCount; ++i) values[i] = (g_rank + 1) * static_cast<int32_t>(i % 1000 + 1);
  node_comm.wait(
      node_comm.allreduce("g", mine.data(), node_sum.data(), kCount, GRADSYNC_INT32, GRADSYNC_SUM));
  std::memcpy(to_send.data(), node_sum.data(), kCount * sizeof(int32_t));
  across_comm.wait(across_comm.allreduce("g", to_send.data(), total.data(), kCount, GRADSYNC_INT32,
                                         GRADSYNC_SUM));
  const auto* sums = static_cast<const int32_t*>(total.data());
  const int32_t ranks_sum = g_ranks * (g_ranks + 1) / 2;
  for (size_t i = 0; i < kCount; ++i) {
    const int32_t expected = ranks_sum * static_cast<int32_t>(i % 1000 + 1);
    EXPECT_OR_FAIL(sums[i] == expected, "element %zu: %d, expected %d", i, sums[i], expected);
  }
  return 0;
}

// A heap of the process (gradsync_heap_create) serving two communicators of two jobs with no
// registration: every kind of collective on its memory checked against the reference; memory of
// neither refused with a clear error; then `cycles` times a block larger than an arena taken,
// used and freed, so that the heap lets its arena go (run it with fewer buffers allowed a
// client than cycles: the test holds only if each released arena is unregistered).
int scenario_heap(const gradsync_options& job, int cycles) {
  gradsync::Heap heap;
  gradsync_options node{};
  EXPECT_OR_FAIL(gradsync_options_node_group(&job, &node) == GRADSYNC_OK, "node group: %s",
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
      EXPECT_OR_FAIL(wrong == 0, "allreduce on heap memory, in place %d: %zu wrong", in_place,
                     wrong);
    }
    reference::fill_input(a, kCount, GRADSYNC_INT32, rank, GRADSYNC_SUM, ++seed);
    c->wait(c->allgather("heap.ag", a, b, kCount, GRADSYNC_INT32));
    size_t wrong = reference::count_wrong(reference::Kind::kAllgather, b, kCount, GRADSYNC_INT32,
                                          GRADSYNC_SUM, ranks, 0, seed);
    EXPECT_OR_FAIL(wrong == 0, "allgather on heap memory: %zu wrong", wrong);
    reference::fill_input(a, kCount * static_cast<size_t>(ranks), GRADSYNC_FLOAT32, rank,
                          GRADSYNC_MAX, ++seed);
    c->wait(c->reduce_scatter("heap.rs", a, b, kCount, GRADSYNC_FLOAT32, GRADSYNC_MAX));
    wrong = reference::count_wrong_reduce_scatter(b, kCount, GRADSYNC_FLOAT32, GRADSYNC_MAX, ranks,
                                                  rank, seed);
    EXPECT_OR_FAIL(wrong == 0, "reduce-scatter on heap memory: %zu wrong", wrong);
    constexpr size_t kWide = kCount / 2;  // int64s: the same bytes
    reference::fill_input(a, kWide * static_cast<size_t>(ranks), GRADSYNC_INT64, rank, GRADSYNC_SUM,
                          ++seed);
    c->wait(c->alltoall("heap.a2a", a, b, kWide, GRADSYNC_INT64));
    wrong =
        reference::count_wrong_alltoall(b, kWide, GRADSYNC_INT64, GRADSYNC_SUM, ranks, rank, seed);
    EXPECT_OR_FAIL(wrong == 0, "all-to-all on heap memory: %zu wrong", wrong);
  }
  // Memory of neither the heap nor a registration: refused before it reaches the daemon.
  std::vector<float> private_memory(64);
  gradsync_request request = 0;
  const gradsync_result refused =
      gradsync_allreduce(comm.get(), "private", private_memory.data(), private_memory.data(),
                         private_memory.size(), GRADSYNC_FLOAT32, GRADSYNC_SUM, &request);
  EXPECT_OR_FAIL(refused == GRADSYNC_ERR_INVALID_ARGUMENT &&
                     std::strstr(gradsync_last_error(comm.get()), "registered") != nullptr,
                 "private memory: %s (%d)", gradsync_last_error(comm.get()), refused);
  EXPECT_OR_FAIL(
      gradsync_heap_free(heap.get(), private_memory.data()) == GRADSYNC_ERR_INVALID_ARGUMENT,
      "freeing memory the heap did not allocate was not refused");
  // Larger than an arena's least size: an arena of its own, let go of once freed.
  constexpr size_t kArenaSized = 65ull << 20;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    auto* big = static_cast<uint8_t*>(heap.allocate(kArenaSized));
    uint8_t* end = big + kArenaSized - kCount * sizeof(float);  // the arena's far end
    reference::fill_input(end, kCount, GRADSYNC_FLOAT32, g_rank, GRADSYNC_SUM, ++seed);
    comm.wait(comm.allreduce("heap.big", end, end, kCount, GRADSYNC_FLOAT32, GRADSYNC_SUM));
    const size_t wrong = reference::count_wrong(reference::Kind::kAllreduce, end, kCount,
                                                GRADSYNC_FLOAT32, GRADSYNC_SUM, g_ranks, 0, seed);
    EXPECT_OR_FAIL(wrong == 0, "cycle %d: allreduce in an arena of its own: %zu wrong", cycle,
                   wrong);
    heap.free(big);
  }
  heap.free(a);
  heap.free(b);
  return 0;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
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
  g_rank = options.rank;
  g_ranks = options.world_size;
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
    if (scenario == "groups") return scenario_groups(options);
    if (scenario == "heap") return scenario_heap(options, std::stoi(args.at(1)));
    if (scenario == "parts_rank_lost") return gradsync::testing::scenario_parts_rank_lost(options);
    if (scenario == "parts_rank_left") return gradsync::testing::scenario_parts_rank_left(options);
    if (scenario == "groups_rank_lost") {
      return gradsync::testing::scenario_groups_rank_lost(options);
    }
    if (scenario == "parts_rank_lost_across_nodes") {
      return gradsync::testing::scenario_parts_rank_lost_across_nodes(options);
    }
    g_unnamed = args.size() > 2 && args[2] == "unnamed";
    Communicator comm(options);
    if (scenario == "collectives") return scenario_collectives(comm);
    if (scenario == "device_refused") return scenario_device_refused(comm);
    if (scenario == "random_order") return scenario_random_order(comm);
    if (scenario == "grouped") return scenario_grouped(comm);
    if (scenario == "wait_timeout") return scenario_wait_timeout(comm);
    if (scenario == "mixed") return scenario_mixed(comm);
    if (scenario == "priorities") return scenario_priorities(comm);
    if (scenario == "fused_sizes") {
      return scenario_fused_sizes(comm, args.size() > 1 ? std::stoi(args[1]) : 1);
    }
    if (scenario == "withhold") {
      return scenario_withhold(comm, args.size() > 1 ? args[1] : "local rank(s) 1",
                               args.size() > 2 ? std::stoi(args[2]) : 1);
    }
    if (scenario == "waiting_for") {
      return scenario_waiting_for(comm, args.size() > 1 ? args[1] : "job rank(s) 1");
    }
    if (scenario == "mismatch") return scenario_mismatch(comm);
    if (scenario == "cluster") return scenario_cluster(comm);
    if (scenario == "steps") {
      return scenario_steps(comm, args.size() > 1 ? std::stoi(args[1]) : 20,
                            args.size() > 2 ? std::stoul(args[2]) : 24,
                            args.size() > 3 ? std::stoul(args[3]) : 40000);
    }
    if (scenario == "large") return scenario_large(comm, std::stoul(args.at(1)));
    if (scenario == "node_order") return scenario_node_order(comm, options.local_world_size);
    if (scenario == "allgathers") return scenario_allgathers(comm, std::stoi(args.at(1)));
    if (scenario == "reduce_scatters") {
      return scenario_reduce_scatters(comm, std::stoi(args.at(1)),
                                      args.size() > 3 ? std::stoi(args[3]) : 0);
    }
    if (scenario == "alltoalls") return scenario_alltoalls(comm, std::stoi(args.at(1)));
    if (scenario == "broadcasts") return scenario_broadcasts(comm, std::stoul(args.at(1)));
    if (scenario == "small_broadcasts") {
      return scenario_small_broadcasts(comm, std::stoi(args.at(1)));
    }
    if (scenario == "encoded") return scenario_encoded(comm, std::stoul(args.at(1)));
    if (scenario == "topk") {
      return gradsync::testing::scenario_topk(comm, g_rank, g_ranks, options.local_world_size,
                                              std::stod(args.at(1)));
    }
    if (scenario == "loop" || scenario == "loop_polling" || scenario == "loop_broadcast") {
      return scenario_loop(comm, args.size() > 1 ? std::stoul(args[1]) : 4096,
                           scenario == "loop_polling", scenario == "loop_broadcast");
    }
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 64;
  } catch (const gradsync::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    return 100 + static_cast<int>(e.code());
  }
}
