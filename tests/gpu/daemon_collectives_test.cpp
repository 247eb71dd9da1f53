// Device collectives through real gradsyncd: K rank processes on one GPU register device
// memory (gradsync_register_device: the IPC handle, the allocation's base, the device's UUID),
// and every op x dtype of allreduce, in place and out of place, broadcast, allgather,
// reduce-scatter and all-to-all come back equal to the reference, on one node and across loopback
// nodes (staged through host memory). The contract tested: a rank's writes are complete (its stream
// synchronised) before it submits, and the result is there when the request completes.
#include "ipc/protocol.h"
#include "tests/gpu/gpu_testing.h"
#include "tests/gpu/spin_kernel.h"
#include "tests/integration/loopback_cluster.h"
#include "tools/common/process.h"
#include "tools/common/reference.h"

#include <gradsync/gradsync.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace gradsync::gpu_testing {
namespace {

constexpr size_t kCount = (1 << 18) + 3;  // not a whole number of 16-byte packs

#define RANK_CHECK(call)                                                                 \
  do {                                                                                   \
    if (const gradsync_result result_ = (call); result_ != GRADSYNC_OK) {                \
      std::fprintf(stderr, "rank: %s: %s: %s\n", #call, gradsync_result_string(result_), \
                   gradsync_last_error(comm));                                           \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

// A rank's memory: cudaMalloc'd, or where kVmmVariable is set, from the VMM API in three
// segments, so that the send and receive ranges cross segment boundaries.
constexpr const char* kVmmVariable = "GRADSYNC_TEST_VMM";
class RankMemory {
 public:
  explicit RankMemory(size_t bytes) {
    if (std::getenv(kVmmVariable) != nullptr) {
      vmm_.emplace(bytes, 3);
    } else {
      plain_.emplace(bytes);
    }
  }
  uint8_t* data() const { return vmm_ ? vmm_->data() : plain_->data(); }
  size_t bytes() const { return vmm_ ? vmm_->bytes() : plain_->bytes(); }

 private:
  std::optional<DeviceMemory> plain_;
  std::optional<VmmMemory> vmm_;
};

int run_rank() {
  gradsync_options options{};
  gradsync_options_from_env(&options);
  gradsync_comm* comm = nullptr;
  if (gradsync_connect(&options, &comm) != GRADSYNC_OK) {
    std::fprintf(stderr, "rank: cannot connect\n");
    return 1;
  }
  // Global ranks: across nodes the job's, on one node the same as the local ones.
  const int rank = options.rank;
  const int ranks = options.world_size;
  // One allocation, registered once: send at 0, receive (room for an allgather) after it.
  const size_t slot = kCount * 8;
  const RankMemory memory(slot * (1 + ranks));
  uint8_t* send = memory.data();
  uint8_t* recv = memory.data() + slot;
  RANK_CHECK(gradsync_register_device(comm, memory.data(), memory.bytes()));
  std::vector<uint8_t> host(slot * ranks);
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "rank %d: wrong result: %s\n", rank, what.c_str());
      ++failures;
    }
  };
  for (const gradsync_dtype dtype : {GRADSYNC_FLOAT32, GRADSYNC_FLOAT64, GRADSYNC_FLOAT16,
                                     GRADSYNC_BFLOAT16, GRADSYNC_INT32, GRADSYNC_INT64}) {
    const size_t bytes = kCount * gradsync_dtype_size(dtype);
    for (const gradsync_op op : {GRADSYNC_SUM, GRADSYNC_AVG, GRADSYNC_MIN, GRADSYNC_MAX,
                                 GRADSYNC_PROD, GRADSYNC_BAND, GRADSYNC_BOR, GRADSYNC_BXOR}) {
      if (!ipc::op_reduces(op, dtype)) continue;
      for (const bool in_place : {false, true}) {
        reference::fill_input(host.data(), kCount, dtype, rank, op);
        GRADSYNC_CUDA_CHECK(cudaMemcpy(send, host.data(), bytes, cudaMemcpyHostToDevice));
        GRADSYNC_CUDA_CHECK(cudaDeviceSynchronize());  // written before it is submitted
        uint8_t* out = in_place ? send : recv;
        gradsync_request request = 0;
        const std::string name = "allreduce." + std::to_string(dtype) + "." + std::to_string(op) +
                                 (in_place ? ".in_place" : "");
        RANK_CHECK(gradsync_allreduce(comm, name.c_str(), send, out, kCount, dtype, op, &request));
        RANK_CHECK(gradsync_wait(comm, request));
        GRADSYNC_CUDA_CHECK(cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost));
        expect(reference::count_wrong(reference::Kind::kAllreduce, host.data(), kCount, dtype, op,
                                      ranks, 0) == 0,
               name);
      }
    }
    // Broadcast from the last rank, then allgather, on the same memory.
    reference::fill_input(host.data(), kCount, dtype, rank, GRADSYNC_SUM);
    GRADSYNC_CUDA_CHECK(cudaMemcpy(send, host.data(), bytes, cudaMemcpyHostToDevice));
    GRADSYNC_CUDA_CHECK(cudaDeviceSynchronize());
    gradsync_request request = 0;
    const std::string suffix = "." + std::to_string(dtype);
    RANK_CHECK(gradsync_broadcast(comm, ("broadcast" + suffix).c_str(), send, recv, kCount, dtype,
                                  ranks - 1, &request));
    RANK_CHECK(gradsync_wait(comm, request));
    GRADSYNC_CUDA_CHECK(cudaMemcpy(host.data(), recv, bytes, cudaMemcpyDeviceToHost));
    expect(reference::count_wrong(reference::Kind::kBroadcast, host.data(), kCount, dtype,
                                  GRADSYNC_SUM, ranks, ranks - 1) == 0,
           "broadcast" + suffix);
    RANK_CHECK(gradsync_allgather(comm, ("allgather" + suffix).c_str(), send, recv, kCount, dtype,
                                  &request));
    RANK_CHECK(gradsync_wait(comm, request));
    GRADSYNC_CUDA_CHECK(cudaMemcpy(host.data(), recv, bytes * ranks, cudaMemcpyDeviceToHost));
    expect(reference::count_wrong(reference::Kind::kAllgather, host.data(), kCount, dtype,
                                  GRADSYNC_SUM, ranks, 0) == 0,
           "allgather" + suffix);
    // Reduce-scatter from the receive area (a block per rank), out of place into the send
    // area, and in place into this rank's own block.
    for (const gradsync_op op : {GRADSYNC_SUM, GRADSYNC_AVG, GRADSYNC_MAX}) {
      for (const bool in_place : {false, true}) {
        reference::fill_input(host.data(), kCount * ranks, dtype, rank, op);
        GRADSYNC_CUDA_CHECK(cudaMemcpy(recv, host.data(), bytes * ranks, cudaMemcpyHostToDevice));
        GRADSYNC_CUDA_CHECK(cudaDeviceSynchronize());
        uint8_t* out = in_place ? recv + bytes * rank : send;
        const std::string name =
            "reduce_scatter" + suffix + "." + std::to_string(op) + (in_place ? ".in_place" : "");
        RANK_CHECK(
            gradsync_reduce_scatter(comm, name.c_str(), recv, out, kCount, dtype, op, &request));
        RANK_CHECK(gradsync_wait(comm, request));
        GRADSYNC_CUDA_CHECK(cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost));
        expect(
            reference::count_wrong_reduce_scatter(host.data(), kCount, dtype, op, ranks, rank) == 0,
            name);
      }
    }
    // All-to-all: a block of kCount / ranks elements for each rank, send area to receive area.
    const size_t exchanged = kCount / static_cast<size_t>(ranks);
    const size_t exchanged_bytes =
        exchanged * static_cast<size_t>(ranks) * gradsync_dtype_size(dtype);
    reference::fill_input(host.data(), exchanged * ranks, dtype, rank, GRADSYNC_SUM);
    GRADSYNC_CUDA_CHECK(cudaMemcpy(send, host.data(), exchanged_bytes, cudaMemcpyHostToDevice));
    GRADSYNC_CUDA_CHECK(cudaDeviceSynchronize());
    RANK_CHECK(gradsync_alltoall(comm, ("alltoall" + suffix).c_str(), send, recv, exchanged, dtype,
                                 &request));
    RANK_CHECK(gradsync_wait(comm, request));
    GRADSYNC_CUDA_CHECK(cudaMemcpy(host.data(), recv, exchanged_bytes, cudaMemcpyDeviceToHost));
    expect(reference::count_wrong_alltoall(host.data(), exchanged, dtype, GRADSYNC_SUM, ranks,
                                           rank) == 0,
           "alltoall" + suffix);
  }
  // Many small tensors in flight at once: across nodes they fuse, each reduced on the device
  // into its place in one staged buffer.
  {
    constexpr int kSmall = 48;
    std::vector<size_t> counts;
    std::vector<size_t> offsets;  // in elements, within send and recv
    size_t total = 0;
    for (int t = 0; t < kSmall; ++t) {
      counts.push_back(static_cast<size_t>(1 + 37 * t));
      offsets.push_back(total);
      total += counts.back();
    }
    std::vector<uint8_t> input(total * sizeof(float));
    for (int t = 0; t < kSmall; ++t) {
      reference::fill_input(input.data() + offsets[t] * sizeof(float), counts[t], GRADSYNC_FLOAT32,
                            rank, GRADSYNC_SUM, t);
    }
    GRADSYNC_CUDA_CHECK(cudaMemcpy(send, input.data(), input.size(), cudaMemcpyHostToDevice));
    GRADSYNC_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<gradsync_request> requests(kSmall);
    for (int t = 0; t < kSmall; ++t) {
      const std::string name = "small." + std::to_string(t);
      RANK_CHECK(gradsync_allreduce(comm, name.c_str(), send + offsets[t] * sizeof(float),
                                    recv + offsets[t] * sizeof(float), counts[t], GRADSYNC_FLOAT32,
                                    GRADSYNC_SUM, &requests[t]));
    }
    for (int t = 0; t < kSmall; ++t) RANK_CHECK(gradsync_wait(comm, requests[t]));
    std::vector<uint8_t> output(total * sizeof(float));
    GRADSYNC_CUDA_CHECK(cudaMemcpy(output.data(), recv, output.size(), cudaMemcpyDeviceToHost));
    for (int t = 0; t < kSmall; ++t) {
      expect(reference::count_wrong(reference::Kind::kAllreduce,
                                    output.data() + offsets[t] * sizeof(float), counts[t],
                                    GRADSYNC_FLOAT32, GRADSYNC_SUM, ranks, 0, t) == 0,
             "small." + std::to_string(t));
    }
  }

  // A large allreduce: across nodes it is staged in pieces (6 here, the last one short), each
  // crossing the network while the next is copied to host memory.
  {
    const size_t count = (size_t{5} << 20) + 3;
    const size_t bytes = count * sizeof(float);
    const RankMemory large(2 * bytes);  // input, then output
    RANK_CHECK(gradsync_register_device(comm, large.data(), large.bytes()));
    std::vector<uint8_t> data(bytes);
    for (const gradsync_op op : {GRADSYNC_SUM, GRADSYNC_AVG}) {
      reference::fill_input(data.data(), count, GRADSYNC_FLOAT32, rank, op);
      GRADSYNC_CUDA_CHECK(cudaMemcpy(large.data(), data.data(), bytes, cudaMemcpyHostToDevice));
      GRADSYNC_CUDA_CHECK(cudaDeviceSynchronize());
      const std::string name = "large." + std::to_string(op);
      gradsync_request request = 0;
      RANK_CHECK(gradsync_allreduce(comm, name.c_str(), large.data(), large.data() + bytes, count,
                                    GRADSYNC_FLOAT32, op, &request));
      RANK_CHECK(gradsync_wait(comm, request));
      GRADSYNC_CUDA_CHECK(
          cudaMemcpy(data.data(), large.data() + bytes, bytes, cudaMemcpyDeviceToHost));
      expect(reference::count_wrong(reference::Kind::kAllreduce, data.data(), count,
                                    GRADSYNC_FLOAT32, op, ranks, 0) == 0,
             name);
    }
    RANK_CHECK(gradsync_unregister(comm, large.data()));
  }

  // Ordered on a stream, the host never synchronising: the stream is busy (a spinning kernel)
  // when the input's copy is queued behind it, and the result is read back on the same stream
  // after gradsync_wait. A daemon that did not wait for the rank's event would reduce the
  // stale 0xff bytes; a stream that did not wait for the daemon's would read them back.
  cudaStream_t stream = nullptr;
  GRADSYNC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RANK_CHECK(gradsync_set_cuda_stream(comm, stream));
  const size_t bytes = kCount * sizeof(float);
  const PinnedMemory input(bytes);
  for (int step = 0; step < 3 * 64; ++step) {  // past the 64 event slots, reusing each
    GRADSYNC_CUDA_CHECK(cudaMemsetAsync(send, 0xff, bytes, stream));
    GRADSYNC_CUDA_CHECK(cudaMemsetAsync(recv, 0xff, bytes, stream));
    GRADSYNC_CUDA_CHECK(cudaStreamSynchronize(stream));
    reference::fill_input(input.data(), kCount, GRADSYNC_FLOAT32, rank, GRADSYNC_SUM, step);
    GRADSYNC_CUDA_CHECK(launch_spin(stream, step % 16 == 0 ? 20'000'000 : 100'000));
    GRADSYNC_CUDA_CHECK(cudaMemcpyAsync(send, input.data(), bytes, cudaMemcpyHostToDevice, stream));
    gradsync_request request = 0;
    const std::string name = "ordered." + std::to_string(step);
    RANK_CHECK(gradsync_allreduce(comm, name.c_str(), send, recv, kCount, GRADSYNC_FLOAT32,
                                  GRADSYNC_SUM, &request));
    RANK_CHECK(gradsync_wait(comm, request));
    std::vector<uint8_t> result(bytes);
    GRADSYNC_CUDA_CHECK(
        cudaMemcpyAsync(result.data(), recv, bytes, cudaMemcpyDeviceToHost, stream));
    GRADSYNC_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect(reference::count_wrong(reference::Kind::kAllreduce, result.data(), kCount,
                                  GRADSYNC_FLOAT32, GRADSYNC_SUM, ranks, 0, step) == 0,
           name);
  }
  RANK_CHECK(gradsync_unset_cuda_stream(comm));
  GRADSYNC_CUDA_CHECK(cudaStreamDestroy(stream));

  // Memory freed and allocated again (at the same address, as allocators like to) is not the
  // memory registered: the submission is refused before the daemon could write the old one.
  {
    void* first = nullptr;
    GRADSYNC_CUDA_CHECK(cudaMalloc(&first, 1 << 20));
    RANK_CHECK(gradsync_register_device(comm, first, 1 << 20));
    GRADSYNC_CUDA_CHECK(cudaFree(first));
    void* second = nullptr;
    GRADSYNC_CUDA_CHECK(cudaMalloc(&second, 1 << 20));
    gradsync_request request = 0;
    const gradsync_result reused = gradsync_allreduce(comm, "reused", second, second, 1024,
                                                      GRADSYNC_FLOAT32, GRADSYNC_SUM, &request);
    expect(reused == GRADSYNC_ERR_INVALID_ARGUMENT, "a freed and reallocated buffer was used");
    if (second == first) {
      expect(std::string(gradsync_last_error(comm)).find("freed") != std::string::npos,
             std::string("the reason names the reuse: ") + gradsync_last_error(comm));
    }
    RANK_CHECK(gradsync_unregister(comm, first));
    GRADSYNC_CUDA_CHECK(cudaFree(second));
  }

  RANK_CHECK(gradsync_unregister(comm, memory.data()));
  gradsync_disconnect(comm);
  return failures == 0 ? 0 : 1;
}

void run_on_one_node(int ranks, bool vmm) {
  tools::PrivateDaemon daemon(tools::executable_dir() + "/gradsyncd");
  std::vector<tools::ChildProcess> children;
  children.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    std::map<std::string, std::string> env{{"GRADSYNC_SOCKET", daemon.socket_path()},
                                           {"GRADSYNC_JOB", "gpu-" + std::to_string(ranks)},
                                           {"RANK", std::to_string(r)},
                                           {"WORLD_SIZE", std::to_string(ranks)},
                                           {"LOCAL_RANK", std::to_string(r)},
                                           {"LOCAL_WORLD_SIZE", std::to_string(ranks)}};
    if (vmm) env[kVmmVariable] = "1";
    children.emplace_back(std::vector<std::string>{"/proc/self/exe", kRankChildFlag}, env);
  }
  for (int r = 0; r < ranks; ++r) {
    const auto status = children[static_cast<size_t>(r)].wait_for(std::chrono::seconds(300));
    ASSERT_TRUE(status.has_value()) << "rank " << r << " hung";
    EXPECT_EQ(*status, 0) << "rank " << r << " failed (its reason is on stderr)";
  }
  EXPECT_EQ(daemon.stop(), 0);
}

class DeviceCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(DeviceCollectivesTest, RanksOnOneGpuGetTheReferenceThroughTheDaemon) {
  run_on_one_node(GetParam(), false);
}

// Memory from cuMemCreate, which CUDA IPC cannot share: registered as a POSIX fd per segment.
class VmmDeviceCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(VmmDeviceCollectivesTest, RanksOnVmmSegmentsGetTheReferenceThroughTheDaemon) {
  run_on_one_node(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(Ranks, VmmDeviceCollectivesTest, ::testing::Values(1, 2));

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceCollectivesTest, ::testing::Values(1, 2, 4, 8));

// `nodes` daemons on loopback with `per_node` ranks each, every one on the one GPU, the ranks'
// environment given `extra`; each rank runs run_rank's checks.
void run_across_nodes(testing::LoopbackCluster& cluster, int nodes, int per_node,
                      const std::string& job, const std::map<std::string, std::string>& extra) {
  const int world = nodes * per_node;
  std::vector<tools::ChildProcess> children;
  children.reserve(static_cast<size_t>(world));
  for (int node = 0; node < nodes; ++node) {
    for (int local = 0; local < per_node; ++local) {
      std::map<std::string, std::string> env{
          {"GRADSYNC_SOCKET", cluster.daemon(node).socket_path()},
          {"GRADSYNC_JOB", job},
          {"GRADSYNC_NODES", cluster.addresses()},
          {"GRADSYNC_NODE_RANK", std::to_string(node)},
          {"RANK", std::to_string(node * per_node + local)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local)},
          {"LOCAL_WORLD_SIZE", std::to_string(per_node)}};
      env.insert(extra.begin(), extra.end());
      children.emplace_back(std::vector<std::string>{"/proc/self/exe", kRankChildFlag}, env);
    }
  }
  for (size_t r = 0; r < children.size(); ++r) {
    const auto status = children[r].wait_for(std::chrono::seconds(300));
    ASSERT_TRUE(status.has_value()) << "rank " << r << " hung";
    EXPECT_EQ(*status, 0) << "rank " << r << " failed (its reason is on stderr)";
  }
  for (int node = 0; node < nodes; ++node) {
    EXPECT_EQ(cluster.daemon(node).stop(), 0) << "node " << node << ": " << cluster.log(node);
  }
}

// nodes x ranks per node, every daemon on the one GPU: a node's ranks are reduced on the
// device, the sum staged through pinned host memory to the other nodes and back.
class DeviceCollectivesAcrossNodesTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(DeviceCollectivesAcrossNodesTest, RanksOnLoopbackNodesGetTheReference) {
  const auto [nodes, per_node] = GetParam();
  testing::LoopbackCluster cluster(nodes);
  run_across_nodes(cluster, nodes, per_node,
                   "gpu-nodes-" + std::to_string(nodes) + "x" + std::to_string(per_node), {});
}

INSTANTIATE_TEST_SUITE_P(NodesByRanks, DeviceCollectivesAcrossNodesTest,
                         ::testing::Values(std::tuple{2, 1}, std::tuple{2, 2}, std::tuple{3, 1}));

// The same with the direct allreduce forced (sums in node order, decision 0029): the fused
// device tensors staged into one host buffer, which it cuts into the nodes' shares.
TEST(DeviceDirectAllreduceAcrossNodes, RanksOnLoopbackNodesGetTheReference) {
  testing::LoopbackCluster cluster(3);
  run_across_nodes(cluster, 3, 2, "gpu-direct-3x2", {{"GRADSYNC_ALGO", "direct"}});
}

// The same through aggregators (docs/aggregators.md): each node's device sum staged to host
// memory, pushed to the aggregators in chunks, their sums back to the device. Nodes, ranks per
// node, aggregators and the allreduce algorithm forced (aggregate, or split with the ring).
class DeviceCollectivesThroughAggregatorsTest
    : public ::testing::TestWithParam<std::tuple<int, int, int, const char*>> {};

TEST_P(DeviceCollectivesThroughAggregatorsTest, RanksOnLoopbackNodesGetTheReference) {
  const auto [nodes, per_node, aggregators, algorithm] = GetParam();
  testing::LoopbackCluster cluster(nodes);
  const std::string listed = cluster.start_aggregators(aggregators);
  run_across_nodes(cluster, nodes, per_node,
                   std::string("gpu-") + algorithm + "-" + std::to_string(nodes) + "x" +
                       std::to_string(per_node),
                   {{"GRADSYNC_AGGREGATORS", listed}, {"GRADSYNC_ALGO", algorithm}});
  for (int a = 0; a < aggregators; ++a) {
    EXPECT_EQ(cluster.aggregator(a).stop(), 0)
        << "aggregator " << a << ": " << cluster.aggregator_log(a);
  }
}

INSTANTIATE_TEST_SUITE_P(NodesRanksAggregators, DeviceCollectivesThroughAggregatorsTest,
                         ::testing::Values(std::tuple{2, 1, 1, "aggregate"},
                                           std::tuple{2, 2, 2, "aggregate"},
                                           std::tuple{3, 1, 2, "split"}));

}  // namespace

int rank_child() {
  try {
    return run_rank();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank: %s\n", e.what());
    return 1;
  }
}

}  // namespace gradsync::gpu_testing
