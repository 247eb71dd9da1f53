// Collectives across node daemons, one algorithm per file. Each runs one ready collective of a
// multi-node job: the local ranks' buffers on this node, the other nodes over NodeLinks. Each
// is a NodeTask (node_task.h) that the engine resumes as the network moves, and that ends with
// an error message when a peer fails (the caller then fails the job). The task refers to its
// arguments until it ends: the caller keeps them in place.
//
// Allreduces run on an AllreduceOperand: one collective in place, or several fused.
#pragma once

#include "cost_model/cost_model.h"
#include "daemon/collectives/internode/allreduce_operand.h"
#include "daemon/collectives/internode/residuals.h"
#include "daemon/job/ready_unit.h"
#include "daemon/links/links.h"
#include "daemon/links/node_task.h"
#include "daemon/links/rank_map.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace gradsync::daemon {

// What a collective across nodes runs with.
struct CollectiveContext {
  NodeLinks& links;
  Scratch& scratch;
  uint32_t sequence;  // the collective's place in the job's agreed order
  int32_t world_size;
  cost_model::WireCodec codec =
      cost_model::WireCodec::kNone;  // the job's: the ring applies it to f32 allreduces
  // Bulk data goes in messages of at most this many bytes (0: a buffer is one message), the
  // same on every node: eagerly, below UCX's rendezvous, where the link is slow (NodeJob).
  uint64_t max_message_bytes = 0;
  // The collective's rank among its job's in flight (priority.h), the same on every node.
  Ranked ranked;
  // The pipeline's piece: the ring cuts each block into pieces of about this size (autotune.h),
  // the same on every node.
  uint64_t piece_bytes = cost_model::kPipelinePieceBytes;
  // Through aggregators (node_aggregate_allreduce.cpp), the same on every node: the largest
  // chunk, and the share of a split allreduce that goes through them (the ring runs the rest).
  uint64_t aggregation_chunk_bytes = 64 << 10;
  double aggregated_share = 1;

  // Before each bulk send (co_await): until the node's pacer lets this job send `bytes`, and no
  // collective of the job holds it back (priority.h).
  NodeAwait<PaceWait> pace(uint64_t bytes) const { return {PaceWait(links, bytes, ranked)}; }
  // The collective's bulk data, over `links` in messages of max_message_bytes.
  transport::Operation send(uint32_t node, uint64_t tag, const void* data, size_t bytes) const {
    return links.send(node, tag, data, bytes, max_message_bytes);
  }
  transport::Operation receive(uint64_t tag, std::optional<uint32_t> sender, void* data,
                               size_t bytes) const {
    return links.receive(tag, sender, data, bytes, max_message_bytes);
  }
};

// The algorithms use scratch slots 0 and 1 (the ring's codec 3 and 4, top-k 5 to 8, the
// aggregators' codec 9); a fused
// allreduce's buffer is this one. (A reduce-scatter's arrivals are slot 0, its sums slot 1.)
inline constexpr size_t kFusionScratchSlot = 2;

NodeTask node_ring_allreduce(CollectiveContext& step, const AllreduceOperand& operand);
NodeTask node_halving_doubling_allreduce(CollectiveContext& step, const AllreduceOperand& operand);
// Every element added in node order, whatever the fusion: the same bits run after run (the
// work in one block).
NodeTask node_direct_allreduce(CollectiveContext& step, const AllreduceOperand& operand);
// Through the job's aggregators (links.aggregators(), at least one): alone, or with
// `aggregated_share` of the data while the ring runs the rest (the split).
NodeTask node_aggregate_allreduce(CollectiveContext& step, const AllreduceOperand& operand);
NodeTask node_split_allreduce(CollectiveContext& step, const AllreduceOperand& operand);
// One of the five.
NodeTask run_allreduce(CollectiveContext& step, const AllreduceOperand& operand,
                       cost_model::AllreduceAlgorithm algorithm);

// The top-k wire codec around an f32 sum or average (node_topk_allreduce.cpp): collectives
// `step.sequence` and the one after.
struct TopKRun {
  double percent;        // of each tensor's chunks sent, rounded up (at least one)
  Residuals& residuals;  // the job's
  // The algorithm for a dense allreduce of so many bytes (the energies, the chosen chunks).
  std::function<cost_model::AllreduceAlgorithm(uint64_t bytes)> choose;
};
NodeTask node_topk_allreduce(CollectiveContext& step, const AllreduceOperand& operand,
                             TopKRun topk);
// Broadcasts, from the root rank on `root_node` (nullopt: a root rank on no node, which the
// rank map refused as the job formed).
NodeTask node_direct_broadcast(CollectiveContext& step, const ReadyCollective& collective,
                               std::optional<uint32_t> root_node);
NodeTask node_chain_broadcast(CollectiveContext& step, const ReadyCollective& collective,
                              uint32_t root_node);
// A small broadcast that piggybacked on the negotiation (node_direct_broadcast.cpp): the root's
// data is its node's contribution, and every other node's is empty. Returns an error for a
// contribution of the wrong size.
NodeResult broadcast_contributions(const ReadyCollective& collective, const RankMap& rank_nodes,
                                   std::span<const std::span<const uint8_t>> contributions);
// One of the two.
NodeTask run_broadcast(CollectiveContext& step, const ReadyCollective& collective,
                       std::optional<uint32_t> root_node, cost_model::BroadcastAlgorithm algorithm);
NodeTask node_allgather(CollectiveContext& step, const ReadyCollective& collective);
// A small allgather that piggybacks on the negotiation (node_allgather.cpp): this node's
// contribution is its ranks' blocks in the order of their global ranks (pack_send_ranges);
// every node's contribution, in node order, then gives every local rank the whole.
// `rank_nodes` must be complete. Returns an error for a contribution of the wrong size.
//
// pack_send_ranges writes each local rank's send range, in the order of their global ranks,
// into `contribution`: an allgather's blocks, an all-to-all's whole send ranges.
void pack_send_ranges(const ReadyCollective& collective, int32_t world_size,
                      std::vector<uint8_t>& contribution);
NodeResult gather_contributions(const ReadyCollective& collective, const RankMap& rank_nodes,
                                int32_t world_size,
                                std::span<const std::span<const uint8_t>> contributions);

// Reduce-scatter (node_reduce_scatter.cpp): every node's ranks, as `rank_nodes` places them,
// get the reduction of their blocks. `rank_nodes` must be complete.
NodeTask node_reduce_scatter(CollectiveContext& step, const ReadyCollective& collective,
                             const RankMap& rank_nodes);
// A small reduce-scatter that piggybacks on the negotiation: this node's contribution is its
// ranks' whole send ranges reduced over the node; every node's contribution, in node order,
// then gives each local rank its block. Returns an error for a contribution of the wrong size.
void pack_reduce_scatter_sums(const ReadyCollective& collective, int32_t world_size,
                              std::vector<uint8_t>& contribution);
NodeResult reduce_scatter_contributions(const ReadyCollective& collective, int32_t world_size,
                                        std::span<const std::span<const uint8_t>> contributions);

// All-to-all (node_alltoall.cpp): one stream of pieces between each pair of nodes, placed by
// `rank_nodes` (complete). A small one piggybacks on the negotiation: this node's contribution
// is its ranks' whole send ranges in rank order (pack_send_ranges), from which every node
// takes its ranks' blocks.
NodeTask node_alltoall(CollectiveContext& step, const ReadyCollective& collective,
                       const RankMap& rank_nodes);
NodeResult alltoall_contributions(const ReadyCollective& collective, const RankMap& rank_nodes,
                                  int32_t world_size,
                                  std::span<const std::span<const uint8_t>> contributions);

// Shared by the algorithms.
namespace node_detail {

// Pieces of the data a node receives from each other node that it holds at once, in the
// algorithms that receive from every node in rounds (the direct allreduce, reduce-scatter and
// all-to-all):
// receives are posted this far ahead and a slot is reused once its piece is reduced. In their
// rounds (round q sends piece q, then reduces piece q - 1 of the node's own), a node sends
// another piece q only once that one is in its round q - 2, so has reduced its piece q - 4:
// with 4 every piece arrives to a receive already posted (eager data never waits in UCX's
// buffers), and the memory is that of 4 pieces whatever the collective's size.
inline constexpr uint64_t kWindowPieces = 4;

// What one node sends another in those algorithms (and the all-to-all), `units` elements or
// bytes, cut alike on both: pieces of `piece` units (the last shorter), at most
// kMaxWindowedPieces of them (a piece's index is part of its tag), of which `slots` are held
// at once, piece p in slot p % slots.
inline constexpr uint64_t kMaxWindowedPieces = 1024;
struct PieceCut {
  uint64_t units = 0;
  uint64_t piece = 1;
  uint64_t pieces = 0;
  uint64_t slots = 0;

  // Pieces of about `wanted_piece` units (the pipeline's piece), fewer where there would be
  // more than kMaxWindowedPieces; one of `units` where they are fewer.
  PieceCut(uint64_t units, uint64_t wanted_piece);
  std::pair<uint64_t, uint64_t> range(uint64_t p) const {
    return {p * piece, std::min(units, (p + 1) * piece)};
  }
};

// Units [begin, end) of a run of equal blocks of `block` units, a block at a time:
// fn(block index in the run, offset in that block, units).
template <typename Fn>
void for_each_block_part(uint64_t begin, uint64_t end, uint64_t block, Fn&& fn) {
  for (uint64_t at = begin; at < end;) {
    const uint64_t index = at / block;
    const uint64_t within = at % block;
    const uint64_t units = std::min(end - at, block - within);
    fn(index, within, units);
    at += units;
  }
}

// The global ranks of each of `nodes` nodes, ascending (`rank_nodes` complete).
std::vector<std::vector<int32_t>> ranks_by_node(const RankMap& rank_nodes, uint32_t nodes,
                                                int32_t world_size);
// Whether the ranks (ascending) run without a gap.
bool consecutive(const std::vector<int32_t>& ranks);
// The local ranks' submissions in the order of `ranks` (this node's, ascending) into `local`;
// an error if the rank map and the submissions disagree.
NodeResult in_rank_order(const ReadyCollective& collective, const std::vector<int32_t>& ranks,
                         std::vector<const Submission*>& local);

// Everything of the ranks' that UCX may touch: handed to the mesh when a collective fails.
std::vector<std::shared_ptr<const void>> rank_memory(const ReadyCollective& collective);

// The submission of the broadcast's root rank, where it is on this node; nullptr elsewhere.
const Submission* root_of(const ReadyCollective& collective);

// Copies `bytes` a pipeline piece (kPipelinePieceBytes) at a time, letting the engine go round
// between the pieces: a collective's own copies overlap its transfers (co_await finish(...)).
NodeTask copy_between_rounds(uint8_t* destination, const uint8_t* source, uint64_t bytes,
                             bool streaming);

// The op the network runs: an average is a sum divided once at the end.
inline gradsync_op network_op(gradsync_op op) {
  return op == GRADSYNC_AVG ? GRADSYNC_SUM : op;
}

}  // namespace node_detail
}  // namespace gradsync::daemon
