// Every inter-node algorithm over the in-process transport, without UCX: 2 to 5 nodes of one or
// two ranks, blocked or interleaved, every dtype, the ops, sizes from one element to several
// pipeline pieces, each result checked on every rank against the reference. The UCX cluster
// tests (tests/integration) run the same algorithms over the real transport.
#include "cost_model/cost_model.h"
#include "daemon/collectives/internode/node_collectives.h"
#include "daemon/links/links.h"
#include "daemon/links/rank_map.h"
#include "ipc/segment.h"
#include "ipc/system.h"
#include "metrics/metrics.h"
#include "tools/common/reference.h"
#include "transport/in_process.h"

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace gradsync::daemon {
namespace {

using cost_model::AllreduceAlgorithm;
using cost_model::BroadcastAlgorithm;

constexpr uint64_t kPipelineElements = cost_model::kPipelinePieceBytes / sizeof(float);

// The sizes every algorithm runs: one element, and a count no node count divides; f32 sums also
// run past one pipeline piece (the UCX cluster tests run many pieces).
const std::vector<uint64_t> kCounts = {1, 1001};
constexpr uint64_t kPastOnePiece = kPipelineElements + 3;

struct DtypeOp {
  gradsync_dtype dtype;
  gradsync_op op;
};
// Every dtype with a sum, and the other ops on the types that make them interesting.
const std::vector<DtypeOp> kReductions = {
    {GRADSYNC_FLOAT32, GRADSYNC_SUM}, {GRADSYNC_FLOAT32, GRADSYNC_AVG},
    {GRADSYNC_FLOAT32, GRADSYNC_MAX}, {GRADSYNC_FLOAT64, GRADSYNC_SUM},
    {GRADSYNC_FLOAT16, GRADSYNC_SUM}, {GRADSYNC_BFLOAT16, GRADSYNC_SUM},
    {GRADSYNC_INT32, GRADSYNC_SUM},   {GRADSYNC_INT32, GRADSYNC_MIN},
    {GRADSYNC_INT64, GRADSYNC_PROD},  {GRADSYNC_INT32, GRADSYNC_BXOR},
    {GRADSYNC_INT64, GRADSYNC_BAND},  {GRADSYNC_INT64, GRADSYNC_BOR},
};

size_t element_bytes(gradsync_dtype dtype) {
  switch (dtype) {
    case GRADSYNC_FLOAT64:
    case GRADSYNC_INT64:
      return 8;
    case GRADSYNC_FLOAT16:
    case GRADSYNC_BFLOAT16:
      return 2;
    default:
      return 4;
  }
}

enum class Placement { kBlocked, kInterleaved };  // rank r on node r / K, or on node r % N

// A session as the control thread makes one: the engine's collectives only read its identity.
std::unique_ptr<Session> make_session(int32_t rank, int32_t world_size, metrics::Metrics& metrics) {
  constexpr uint32_t kEntries = 8;
  const ipc::SegmentLayout layout = ipc::SegmentLayout::for_entries(kEntries);
  const ipc::UniqueFd fd = ipc::create_sealed_memfd("algorithm-test", layout.total_bytes);
  ipc::Mapping segment(fd.get(), 0, layout.total_bytes);
  ipc::write_segment_header(segment.data(), kEntries);
  ClientIdentity who;
  who.job = "algorithms";
  who.rank = rank;
  who.world_size = world_size;
  return std::make_unique<Session>(static_cast<uint64_t>(rank) + 1, who, std::move(segment),
                                   kEntries, ipc::create_eventfd(), metrics);
}

// N node daemons' views of one job on an in-process network, and its ranks' buffers.
class Cluster {
 public:
  Cluster(uint32_t nodes, int32_t ranks_per_node, Placement placement)
      : network_(nodes),
        world_size_(static_cast<int32_t>(nodes) * ranks_per_node),
        rank_map_(nodes, world_size_),
        ranks_of_node_(nodes) {
    for (int32_t rank = 0; rank < world_size_; ++rank) {
      const auto node = static_cast<uint32_t>(placement == Placement::kBlocked
                                                  ? rank / ranks_per_node
                                                  : rank % static_cast<int32_t>(nodes));
      ranks_of_node_[node].push_back(rank);
      sessions_.push_back(make_session(rank, world_size_, metrics_));
    }
    NodeLayout layout;
    for (uint32_t node = 0; node < nodes; ++node) {
      layout.nodes.push_back(transport::InProcessNetwork::address(node));
    }
    layout.world_size = world_size_;
    for (uint32_t node = 0; node < nodes; ++node) {
      rank_map_.add(node, ranks_of_node_[node]);
      layout.node_rank = node;
      links_.push_back(std::make_unique<NodeLinks>("algorithms", layout, network_.node(node),
                                                   std::chrono::seconds(5)));
      scratch_.push_back(std::make_unique<Scratch>());
    }
  }

  uint32_t nodes() const { return network_.nodes(); }
  int32_t world_size() const { return world_size_; }
  const RankMap& rank_map() const { return rank_map_; }
  transport::InProcessNetwork& network() { return network_; }

  // Fresh buffers for every rank: `send_count` elements of its input, `recv_count` zeroed (or
  // none, for a collective in place in its send buffer).
  void fill(gradsync_dtype dtype, gradsync_op op, uint64_t send_count, uint64_t recv_count) {
    send_.assign(static_cast<size_t>(world_size_), {});
    recv_.assign(static_cast<size_t>(world_size_), {});
    for (int32_t rank = 0; rank < world_size_; ++rank) {
      auto& send = send_[static_cast<size_t>(rank)];
      send.assign(send_count * element_bytes(dtype), 0);
      reference::fill_input(send.data(), send_count, dtype, rank, op);
      recv_[static_cast<size_t>(rank)].assign(recv_count * element_bytes(dtype), 0);
    }
  }
  // f32 inputs of every magnitude from 2^-20 to 2^20, either sign, out of place: sums of them
  // round differently in different orders.
  void fill_mixed_magnitudes(uint64_t count, uint32_t seed) {
    fill(GRADSYNC_FLOAT32, GRADSYNC_SUM, count, count);
    for (size_t rank = 0; rank < send_.size(); ++rank) {
      reference::fill_mixed_magnitudes(reinterpret_cast<float*>(send_[rank].data()), count,
                                       seed + static_cast<uint32_t>(rank));
    }
  }
  float input(int32_t rank, uint64_t i) const {
    return reinterpret_cast<const float*>(send_[static_cast<size_t>(rank)].data())[i];
  }
  const std::vector<int32_t>& ranks_of(uint32_t node) const { return ranks_of_node_[node]; }
  size_t scratch_bytes(uint32_t node) const { return scratch_[node]->bytes(); }

  // Rank `rank`'s result: its receive buffer, or its send buffer when in place.
  const void* result(int32_t rank) const {
    const auto& recv = recv_[static_cast<size_t>(rank)];
    return recv.empty() ? send_[static_cast<size_t>(rank)].data() : recv.data();
  }

  // Node `node`'s ranks' submissions of one collective, in the order of their local ranks.
  ReadyCollective ready(uint32_t node, ipc::Collective collective, gradsync_dtype dtype,
                        gradsync_op op, uint64_t count, int32_t root = 0) {
    ReadyCollective ready;
    for (const int32_t rank : ranks_of_node_[node]) {
      Submission s;
      s.session = sessions_[static_cast<size_t>(rank)].get();
      s.name = "tensor";
      s.collective = collective;
      s.dtype = dtype;
      s.op = op;
      s.root = root;
      s.count = count;
      auto& send = send_[static_cast<size_t>(rank)];
      auto& recv = recv_[static_cast<size_t>(rank)];
      s.send = send.data();
      s.recv = recv.empty() ? send.data() : recv.data();
      ready.ranks.push_back(std::move(s));
    }
    return ready;
  }

  // Runs one task per node (but `skip`) to its end, the way the engine polls them; each
  // node's result. Fails the test instead of hanging.
  using Start = std::function<NodeTask(uint32_t node, CollectiveContext& context)>;
  std::vector<NodeResult> run(const Start& start, uint32_t sequences = 1,
                              std::optional<uint32_t> skip = std::nullopt) {
    std::vector<std::unique_ptr<CollectiveContext>> contexts;
    std::vector<NodeTask> tasks;
    std::vector<uint32_t> running;
    for (uint32_t node = 0; node < nodes(); ++node) {
      if (node == skip) continue;
      contexts.push_back(std::make_unique<CollectiveContext>(
          CollectiveContext{*links_[node], *scratch_[node], sequence_, world_size_}));
      tasks.push_back(start(node, *contexts.back()));
      running.push_back(node);
    }
    sequence_ += sequences;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (bool all_done = false; !all_done;) {
      all_done = true;
      for (NodeTask& task : tasks) all_done = task.poll() && all_done;
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "the nodes' tasks did not end within 60 s";
        break;
      }
    }
    std::vector<NodeResult> results(nodes());
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (tasks[i].done()) results[running[i]] = tasks[i].result();
    }
    return results;
  }

 private:
  transport::InProcessNetwork network_;
  metrics::Metrics metrics_{"", metrics::BuildInfo{}, ""};
  int32_t world_size_;
  RankMap rank_map_;
  std::vector<std::vector<int32_t>> ranks_of_node_;
  std::vector<std::unique_ptr<Session>> sessions_;  // by global rank
  std::vector<std::unique_ptr<NodeLinks>> links_;
  std::vector<std::unique_ptr<Scratch>> scratch_;
  std::vector<std::vector<uint8_t>> send_;  // by global rank
  std::vector<std::vector<uint8_t>> recv_;
  uint32_t sequence_ = 0;
};

void expect_no_errors(const std::vector<NodeResult>& results) {
  for (size_t node = 0; node < results.size(); ++node) {
    EXPECT_FALSE(results[node]) << "node " << node << ": " << *results[node];
  }
}

struct Shape {
  uint32_t nodes;
  int32_t ranks_per_node;
  Placement placement;
};

std::string shape_name(const testing::TestParamInfo<Shape>& info) {
  return std::to_string(info.param.nodes) + "nodes" + std::to_string(info.param.ranks_per_node) +
         "ranks" + (info.param.placement == Placement::kBlocked ? "" : "Interleaved");
}

class InterNodeAlgorithms : public testing::TestWithParam<Shape> {
 protected:
  InterNodeAlgorithms()
      : cluster_(GetParam().nodes, GetParam().ranks_per_node, GetParam().placement) {}

  // An allreduce of every reduction and size by `algorithm` (and the wire codec), checked on
  // every rank; in place, or out of place.
  void allreduce(const std::function<NodeTask(CollectiveContext&, const AllreduceOperand&)>& run,
                 cost_model::WireCodec codec = cost_model::WireCodec::kNone,
                 const std::vector<DtypeOp>& reductions = kReductions) {
    for (const DtypeOp& r : reductions) {
      std::vector<uint64_t> counts = kCounts;
      if (r.dtype == GRADSYNC_FLOAT32 && r.op == GRADSYNC_SUM) counts.push_back(kPastOnePiece);
      for (const uint64_t count : counts) {
        for (const bool in_place : {true, false}) {
          if (!in_place && count == kPastOnePiece) continue;
          SCOPED_TRACE(::testing::Message() << "dtype " << r.dtype << " op " << r.op << " count "
                                            << count << (in_place ? " in place" : ""));
          cluster_.fill(r.dtype, r.op, count, in_place ? 0 : count);
          std::vector<ReadyCollective> ready;
          std::vector<std::unique_ptr<AllreduceOperand>> operands;
          for (uint32_t node = 0; node < cluster_.nodes(); ++node) {
            ready.push_back(
                cluster_.ready(node, ipc::Collective::kAllreduce, r.dtype, r.op, count));
          }
          operands.reserve(ready.size());
          for (const auto& collective : ready) {
            operands.push_back(std::make_unique<AllreduceOperand>(collective));
          }
          // The top-k codec runs as two collectives of the agreed order (node_collectives.h).
          const uint32_t sequences = codec == cost_model::WireCodec::kTopK ? 2 : 1;
          expect_no_errors(cluster_.run(
              [&](uint32_t node, CollectiveContext& context) {
                context.codec = codec;
                return run(context, *operands[node]);
              },
              sequences));
          for (int32_t rank = 0; rank < cluster_.world_size(); ++rank) {
            ASSERT_EQ(reference::count_wrong(reference::Kind::kAllreduce, cluster_.result(rank),
                                             count, r.dtype, r.op, cluster_.world_size(), 0),
                      0u)
                << "rank " << rank;
          }
        }
      }
    }
  }

  // A reduce-scatter of `count` elements a rank in pieces of `piece_bytes`, checked on every
  // rank.
  void reduce_scatter(const DtypeOp& r, uint64_t count, uint64_t piece_bytes) {
    cluster_.fill(r.dtype, r.op, count * static_cast<uint64_t>(cluster_.world_size()), count);
    std::vector<ReadyCollective> ready;
    for (uint32_t node = 0; node < cluster_.nodes(); ++node) {
      ready.push_back(cluster_.ready(node, ipc::Collective::kReduceScatter, r.dtype, r.op, count));
    }
    expect_no_errors(cluster_.run([&](uint32_t node, CollectiveContext& context) {
      context.piece_bytes = piece_bytes;
      return node_reduce_scatter(context, ready[node], cluster_.rank_map());
    }));
    for (int32_t rank = 0; rank < cluster_.world_size(); ++rank) {
      ASSERT_EQ(reference::count_wrong_reduce_scatter(cluster_.result(rank), count, r.dtype, r.op,
                                                      cluster_.world_size(), rank),
                0u)
          << "rank " << rank;
    }
  }

  // An all-to-all of `count` elements a block in pieces of `piece_bytes`, checked on every rank.
  void alltoall(gradsync_dtype dtype, uint64_t count, uint64_t piece_bytes) {
    const uint64_t world = static_cast<uint64_t>(cluster_.world_size());
    cluster_.fill(dtype, GRADSYNC_SUM, count * world, count * world);
    std::vector<ReadyCollective> ready;
    for (uint32_t node = 0; node < cluster_.nodes(); ++node) {
      ready.push_back(cluster_.ready(node, ipc::Collective::kAllToAll, dtype, GRADSYNC_SUM, count));
    }
    expect_no_errors(cluster_.run([&](uint32_t node, CollectiveContext& context) {
      context.piece_bytes = piece_bytes;
      return node_alltoall(context, ready[node], cluster_.rank_map());
    }));
    for (int32_t rank = 0; rank < cluster_.world_size(); ++rank) {
      ASSERT_EQ(reference::count_wrong_alltoall(cluster_.result(rank), count, dtype, GRADSYNC_SUM,
                                                cluster_.world_size(), rank),
                0u)
          << "rank " << rank;
    }
  }

  void broadcast(BroadcastAlgorithm algorithm) {
    for (const uint64_t count : {uint64_t{1}, uint64_t{1001}, kPastOnePiece}) {
      for (int32_t root = 0; root < cluster_.world_size(); ++root) {
        // Past a piece from the first and the last rank only: the others take the same path.
        if (count == kPastOnePiece && root != 0 && root != cluster_.world_size() - 1) continue;
        SCOPED_TRACE(::testing::Message() << "count " << count << " root " << root);
        cluster_.fill(GRADSYNC_FLOAT32, GRADSYNC_SUM, count, 0);
        std::vector<ReadyCollective> ready;
        for (uint32_t node = 0; node < cluster_.nodes(); ++node) {
          ready.push_back(cluster_.ready(node, ipc::Collective::kBroadcast, GRADSYNC_FLOAT32,
                                         GRADSYNC_SUM, count, root));
        }
        const auto root_node = cluster_.rank_map().node_of(root);
        expect_no_errors(cluster_.run([&](uint32_t node, CollectiveContext& context) {
          return run_broadcast(context, ready[node], root_node, algorithm);
        }));
        for (int32_t rank = 0; rank < cluster_.world_size(); ++rank) {
          ASSERT_EQ(
              reference::count_wrong(reference::Kind::kBroadcast, cluster_.result(rank), count,
                                     GRADSYNC_FLOAT32, GRADSYNC_SUM, cluster_.world_size(), root),
              0u)
              << "rank " << rank;
        }
      }
    }
  }

  Cluster cluster_;
};

TEST_P(InterNodeAlgorithms, RingAllreduce) {
  allreduce(
      [](CollectiveContext& c, const AllreduceOperand& o) { return node_ring_allreduce(c, o); });
}

TEST_P(InterNodeAlgorithms, HalvingDoublingAllreduce) {
  allreduce([](CollectiveContext& c, const AllreduceOperand& o) {
    return node_halving_doubling_allreduce(c, o);
  });
  // What arrives at once, so what a node holds: half the work (the largest run is f32 sums past
  // a piece), or the whole from a partner that sits out.
  const uint32_t nodes = cluster_.nodes();
  const uint32_t extra = nodes - std::bit_floor(nodes);
  for (uint32_t node = 0; node < nodes; ++node) {
    const bool folds_in = node < 2 * extra && node % 2 == 1;
    const uint64_t most = folds_in ? kPastOnePiece : kPastOnePiece - kPastOnePiece / 2;
    EXPECT_LE(cluster_.scratch_bytes(node), most * sizeof(float)) << "node " << node;
  }
}

// Halving-doubling in pieces far smaller than a level's half: every result right, and a node
// that takes part in the levels holds a window of four pieces, not the half (one that takes in
// a partner sitting out holds that partner's whole data).
TEST_P(InterNodeAlgorithms, HalvingDoublingAllreduceInSmallPieces) {
  constexpr uint64_t kCount = 3001;
  constexpr uint64_t kPieceBytes = 256;
  cluster_.fill(GRADSYNC_FLOAT32, GRADSYNC_SUM, kCount, kCount);
  std::vector<ReadyCollective> ready;
  std::vector<std::unique_ptr<AllreduceOperand>> operands;
  for (uint32_t node = 0; node < cluster_.nodes(); ++node) {
    ready.push_back(
        cluster_.ready(node, ipc::Collective::kAllreduce, GRADSYNC_FLOAT32, GRADSYNC_SUM, kCount));
  }
  operands.reserve(ready.size());
  for (const auto& collective : ready) {
    operands.push_back(std::make_unique<AllreduceOperand>(collective));
  }
  expect_no_errors(cluster_.run([&](uint32_t node, CollectiveContext& c) {
    c.piece_bytes = kPieceBytes;
    return node_halving_doubling_allreduce(c, *operands[node]);
  }));
  for (int32_t rank = 0; rank < cluster_.world_size(); ++rank) {
    ASSERT_EQ(reference::count_wrong(reference::Kind::kAllreduce, cluster_.result(rank), kCount,
                                     GRADSYNC_FLOAT32, GRADSYNC_SUM, cluster_.world_size(), 0),
              0u)
        << "rank " << rank;
  }
  const uint32_t nodes = cluster_.nodes();
  const uint32_t extra = nodes - std::bit_floor(nodes);
  for (uint32_t node = 0; node < nodes; ++node) {
    const bool folds_in = node < 2 * extra && node % 2 == 1;
    const uint64_t most = folds_in ? kCount * sizeof(float) : 4 * kPieceBytes;
    EXPECT_LE(cluster_.scratch_bytes(node), most) << "node " << node;
  }
}

TEST_P(InterNodeAlgorithms, DirectAllreduce) {
  allreduce(
      [](CollectiveContext& c, const AllreduceOperand& o) { return node_direct_allreduce(c, o); });
}

// The direct allreduce's point: every element is the nodes' sums added in node order, each
// node's sum its ranks' inputs added in local rank order, to the bit: for the tensor alone
// and for the same tensor cut in two at an odd place (as fusion with other tensors would place
// its elements elsewhere in the work), in pieces far smaller than a node's share; the partial
// sums arriving in a window of four pieces.
TEST_P(InterNodeAlgorithms, DirectAllreduceAddsInNodeOrderWhateverTheFusion) {
  const uint64_t count = 3001;
  cluster_.fill_mixed_magnitudes(count, 7);
  const uint32_t nodes = cluster_.nodes();
  std::vector<float> expected(count);
  std::vector<float> rotated(count);  // node 1's sum first: another order
  std::vector<float> node_sums(nodes);
  for (uint64_t i = 0; i < count; ++i) {
    for (uint32_t node = 0; node < nodes; ++node) {
      const std::vector<int32_t>& ranks = cluster_.ranks_of(node);
      float sum = cluster_.input(ranks.front(), i);
      for (size_t r = 1; r < ranks.size(); ++r) sum += cluster_.input(ranks[r], i);
      node_sums[node] = sum;
    }
    expected[i] = node_sums[0];
    for (uint32_t node = 1; node < nodes; ++node) expected[i] += node_sums[node];
    rotated[i] = node_sums[1 % nodes];
    for (uint32_t k = 1; k < nodes; ++k) rotated[i] += node_sums[(1 + k) % nodes];
  }
  // How many of `count` floats at `got` are not `want`'s bits.
  auto differing = [&](const void* got, const std::vector<float>& want) {
    uint64_t n = 0;
    for (uint64_t i = 0; i < count; ++i) {
      n += std::bit_cast<uint32_t>(static_cast<const float*>(got)[i]) !=
           std::bit_cast<uint32_t>(want[i]);
    }
    return n;
  };
  if (nodes >= 3) {
    // Else addition's commutativity makes every order one: the data must tell orders apart.
    ASSERT_NE(differing(rotated.data(), expected), 0u);
  }
  auto expect_node_order = [&](const char* how) {
    for (int32_t rank = 0; rank < cluster_.world_size(); ++rank) {
      ASSERT_EQ(differing(cluster_.result(rank), expected), 0u) << how << ", rank " << rank;
    }
  };
  std::vector<ReadyCollective> ready;
  for (uint32_t node = 0; node < nodes; ++node) {
    ready.push_back(
        cluster_.ready(node, ipc::Collective::kAllreduce, GRADSYNC_FLOAT32, GRADSYNC_SUM, count));
  }
  constexpr uint64_t kPieceBytes = 256;
  std::vector<std::unique_ptr<AllreduceOperand>> whole;
  whole.reserve(nodes);
  for (const auto& collective : ready)
    whole.push_back(std::make_unique<AllreduceOperand>(collective));
  expect_no_errors(cluster_.run([&](uint32_t node, CollectiveContext& c) {
    c.piece_bytes = kPieceBytes;
    return node_direct_allreduce(c, *whole[node]);
  }));
  expect_node_order("alone");

  cluster_.fill_mixed_magnitudes(count, 7);  // the same inputs, the results cleared
  std::vector<std::vector<uint8_t>> work(nodes, std::vector<uint8_t>(count * sizeof(float)));
  std::vector<std::unique_ptr<AllreduceOperand>> packed;
  for (uint32_t node = 0; node < nodes; ++node) {
    packed.push_back(std::make_unique<AllreduceOperand>(ready[node], work[node].data()));
  }
  constexpr uint64_t kCut = 1237;
  for (const auto& [begin, end] : {std::pair{uint64_t{0}, kCut}, std::pair{kCut, count}}) {
    std::vector<AllreduceOperand> parts;
    parts.reserve(nodes);
    for (const auto& operand : packed) parts.push_back(operand->slice(begin, end));
    expect_no_errors(cluster_.run([&](uint32_t node, CollectiveContext& c) {
      c.piece_bytes = kPieceBytes;
      return node_direct_allreduce(c, parts[node]);
    }));
  }
  expect_node_order("cut in two");
  // Each node held a window of pieces of the others' sums, not its whole share of them.
  for (uint32_t node = 0; node < nodes; ++node) {
    EXPECT_LE(cluster_.scratch_bytes(node), uint64_t{nodes - 1} * 4 * kPieceBytes)
        << "node " << node;
  }
}

// The ring's bf16 wire codec: the inputs and every partial sum are small integers, exact in
// bf16, so the sum is exact too (an average's division is not, so it is left out).
TEST_P(InterNodeAlgorithms, RingAllreduceThroughTheBf16Codec) {
  allreduce(
      [](CollectiveContext& c, const AllreduceOperand& o) { return node_ring_allreduce(c, o); },
      cost_model::WireCodec::kBf16, {{GRADSYNC_FLOAT32, GRADSYNC_SUM}});
}

// Top-k sending every chunk: nothing is held back, so the sum is the dense one.
TEST_P(InterNodeAlgorithms, TopKAllreduceOfEveryChunk) {
  std::vector<std::unique_ptr<Residuals>> residuals;
  for (uint32_t node = 0; node < GetParam().nodes; ++node) {
    residuals.push_back(std::make_unique<Residuals>());
  }
  allreduce(
      [&](CollectiveContext& c, const AllreduceOperand& o) {
        const TopKRun topk{100, *residuals[c.links.me()],
                           [](uint64_t) { return AllreduceAlgorithm::kRing; }};
        return node_topk_allreduce(c, o, topk);
      },
      cost_model::WireCodec::kTopK,
      {{GRADSYNC_FLOAT32, GRADSYNC_SUM}, {GRADSYNC_FLOAT32, GRADSYNC_AVG}});
}

TEST_P(InterNodeAlgorithms, DirectBroadcastFromEveryRoot) {
  broadcast(BroadcastAlgorithm::kDirect);
}

TEST_P(InterNodeAlgorithms, ChainBroadcastFromEveryRoot) {
  broadcast(BroadcastAlgorithm::kChain);
}

TEST_P(InterNodeAlgorithms, Allgather) {
  const auto world = static_cast<uint64_t>(cluster_.world_size());
  // Past a piece: the whole result, each rank's block a share of it.
  for (const uint64_t count : {uint64_t{1}, uint64_t{1001}, kPastOnePiece / world + 3}) {
    for (const gradsync_dtype dtype : {GRADSYNC_FLOAT32, GRADSYNC_FLOAT16, GRADSYNC_INT64}) {
      if (count > 1001 && dtype != GRADSYNC_FLOAT32) continue;
      SCOPED_TRACE(::testing::Message() << "dtype " << dtype << " count " << count);
      cluster_.fill(dtype, GRADSYNC_SUM, count, count * world);
      std::vector<ReadyCollective> ready;
      for (uint32_t node = 0; node < cluster_.nodes(); ++node) {
        ready.push_back(
            cluster_.ready(node, ipc::Collective::kAllgather, dtype, GRADSYNC_SUM, count));
      }
      expect_no_errors(cluster_.run([&](uint32_t node, CollectiveContext& context) {
        return node_allgather(context, ready[node]);
      }));
      for (int32_t rank = 0; rank < cluster_.world_size(); ++rank) {
        ASSERT_EQ(reference::count_wrong(reference::Kind::kAllgather, cluster_.result(rank), count,
                                         dtype, GRADSYNC_SUM, cluster_.world_size(), 0),
                  0u)
            << "rank " << rank;
      }
    }
  }
}

TEST_P(InterNodeAlgorithms, ReduceScatter) {
  const auto world = static_cast<uint64_t>(cluster_.world_size());
  for (const DtypeOp& r : kReductions) {
    // Past a piece: each rank's send range.
    for (const uint64_t count : {uint64_t{1}, uint64_t{1001}, kPastOnePiece / world + 3}) {
      if (count > 1001 && (r.dtype != GRADSYNC_FLOAT32 || r.op != GRADSYNC_SUM)) continue;
      SCOPED_TRACE(::testing::Message()
                   << "dtype " << r.dtype << " op " << r.op << " count " << count);
      reduce_scatter(r, count, cost_model::kPipelinePieceBytes);
    }
  }
}

// In pieces far smaller than what goes to a node: each node holds a window of four pieces of
// what arrives from each other node and of what it packs for each, whatever the size.
TEST_P(InterNodeAlgorithms, ReduceScatterInAWindowOfSmallPieces) {
  constexpr uint64_t kPieceBytes = 256;
  const uint64_t count = 3001;
  for (const DtypeOp& r :
       {DtypeOp{GRADSYNC_FLOAT32, GRADSYNC_SUM}, DtypeOp{GRADSYNC_INT64, GRADSYNC_MAX},
        DtypeOp{GRADSYNC_FLOAT64, GRADSYNC_AVG}}) {
    SCOPED_TRACE(::testing::Message() << "dtype " << r.dtype << " op " << r.op);
    reduce_scatter(r, count, kPieceBytes);
  }
  const uint64_t nodes = cluster_.nodes();
  for (uint32_t node = 0; node < nodes; ++node) {
    EXPECT_LE(cluster_.scratch_bytes(node), 2 * (nodes - 1) * 4 * kPieceBytes) << "node " << node;
  }
}

// Pieces of one stream between each pair of nodes, whatever their ranks: none rank to rank.
TEST_P(InterNodeAlgorithms, AllToAllSendsOnlyBetweenNodePairs) {
  const auto world = static_cast<uint64_t>(cluster_.world_size());
  for (const uint64_t count : {uint64_t{1}, uint64_t{1001}, kPastOnePiece / world + 3}) {
    for (const gradsync_dtype dtype : {GRADSYNC_FLOAT32, GRADSYNC_BFLOAT16, GRADSYNC_INT64}) {
      if (count > 1001 && dtype != GRADSYNC_FLOAT32) continue;
      SCOPED_TRACE(::testing::Message() << "dtype " << dtype << " count " << count);
      const uint64_t messages_before = cluster_.network().messages_sent();
      alltoall(dtype, count, cost_model::kPipelinePieceBytes);
      uint64_t pieces = 0;
      for (uint32_t from = 0; from < cluster_.nodes(); ++from) {
        for (uint32_t to = 0; to < cluster_.nodes(); ++to) {
          if (from == to) continue;
          const uint64_t stream = count * element_bytes(dtype) * cluster_.ranks_of(from).size() *
                                  cluster_.ranks_of(to).size();
          pieces += node_detail::PieceCut(stream, cost_model::kPipelinePieceBytes).pieces;
        }
      }
      EXPECT_EQ(cluster_.network().messages_sent() - messages_before, pieces);
    }
  }
}

// In pieces far smaller than a stream: each node holds a window of four pieces of what it
// packs for each other node and of what arrives from each, whatever the size.
TEST_P(InterNodeAlgorithms, AllToAllInAWindowOfSmallPieces) {
  constexpr uint64_t kPieceBytes = 256;
  for (const gradsync_dtype dtype : {GRADSYNC_FLOAT32, GRADSYNC_BFLOAT16, GRADSYNC_INT64}) {
    SCOPED_TRACE(::testing::Message() << "dtype " << dtype);
    alltoall(dtype, 3001, kPieceBytes);
  }
  const uint64_t nodes = cluster_.nodes();
  for (uint32_t node = 0; node < nodes; ++node) {
    EXPECT_LE(cluster_.scratch_bytes(node), 2 * (nodes - 1) * 4 * kPieceBytes) << "node " << node;
  }
}

// A node that dies before the collective: every other node's task ends with an error instead
// of waiting for it.
TEST_P(InterNodeAlgorithms, ALostNodeFailsEveryAlgorithmOnTheOthers) {
  const uint32_t lost = GetParam().nodes - 1;
  cluster_.network().fail(lost, "its daemon was killed");
  const uint64_t count = 1001;
  cluster_.fill(GRADSYNC_FLOAT32, GRADSYNC_SUM,
                count * static_cast<uint64_t>(cluster_.world_size()), 0);
  std::vector<ReadyCollective> ready;
  std::vector<std::unique_ptr<AllreduceOperand>> operands;
  for (uint32_t node = 0; node < cluster_.nodes(); ++node) {
    ready.push_back(
        cluster_.ready(node, ipc::Collective::kAllreduce, GRADSYNC_FLOAT32, GRADSYNC_SUM, count));
  }
  operands.reserve(ready.size());
  for (const auto& collective : ready) {
    operands.push_back(std::make_unique<AllreduceOperand>(collective));
  }
  const std::vector<Cluster::Start> algorithms = {
      [&](uint32_t node, CollectiveContext& c) { return node_ring_allreduce(c, *operands[node]); },
      [&](uint32_t node, CollectiveContext& c) {
        return node_halving_doubling_allreduce(c, *operands[node]);
      },
      [&](uint32_t node, CollectiveContext& c) {
        return node_direct_allreduce(c, *operands[node]);
      },
      [&](uint32_t node, CollectiveContext& c) {
        return run_broadcast(c, ready[node], lost, BroadcastAlgorithm::kChain);
      },
      [&](uint32_t node, CollectiveContext& c) {
        return run_broadcast(c, ready[node], lost, BroadcastAlgorithm::kDirect);
      },
  };
  for (size_t a = 0; a < algorithms.size(); ++a) {
    SCOPED_TRACE(::testing::Message() << "algorithm " << a);
    const auto results = cluster_.run(algorithms[a], 1, lost);
    for (uint32_t node = 0; node < lost; ++node) {
      ASSERT_TRUE(results[node]) << "node " << node << " went on without the lost node";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Nodes, InterNodeAlgorithms,
    testing::Values(Shape{2, 1, Placement::kBlocked}, Shape{3, 1, Placement::kBlocked},
                    Shape{4, 1, Placement::kBlocked}, Shape{5, 1, Placement::kBlocked},
                    Shape{2, 2, Placement::kBlocked}, Shape{3, 2, Placement::kInterleaved},
                    Shape{4, 2, Placement::kInterleaved}),
    shape_name);

// A bulk send waits while a collective of its job with another priority that ranks higher is
// in flight (docs/priority.md); one of the same priority never holds it back, and one queued
// long enough after it no longer does.
TEST(PaceWait, OnlyAHigherRankedCollectiveOfAnotherPriorityHoldsASendBack) {
  transport::InProcessNetwork network(2);
  NodeLayout layout;
  layout.nodes = {transport::InProcessNetwork::address(0), transport::InProcessNetwork::address(1)};
  layout.world_size = 2;
  NodeLinks links("priorities", layout, network.node(0), std::chrono::seconds(5));
  const Ranked low{0, priority_rank(0, 10)};
  EXPECT_TRUE(PaceWait(links, 1024, low).ready()) << "nothing in flight";
  links.set_top(Ranked{5, priority_rank(5, 11)});
  EXPECT_FALSE(PaceWait(links, 1024, low).ready()) << "priority 5, queued just after";
  EXPECT_TRUE(PaceWait(links, 1024, Ranked{5, priority_rank(5, 12)}).ready()) << "same priority";
  links.set_top(Ranked{5, priority_rank(5, 10 + 5 * kPriorityAgingStep + 1)});
  EXPECT_TRUE(PaceWait(links, 1024, low).ready()) << "queued 81 collectives later";
  links.set_top(std::nullopt);
  EXPECT_TRUE(PaceWait(links, 1024, low).ready());
}

}  // namespace
}  // namespace gradsync::daemon
