// Reduce-scatter across nodes, direct: every node reduces, over its own ranks, the blocks that
// belong to another node's ranks and sends them to that node; it receives every other node's
// partial sums of its own ranks' blocks and reduces them, with its ranks' inputs, straight into
// each local rank's receive range. A node sends and receives (n-1)/n of a rank's send range
// once: the bytes of a ring's reduce-scatter, in one step instead of n-1.
//
// Pipelined: what goes to a node is cut into pieces, each reduced and sent while the next is
// reduced, and each arriving piece is reduced into the results as soon as it is there from
// every node. A node with one local rank sends that rank's blocks straight from its buffer
// where the receiving node's ranks are consecutive (the usual placement): no copy.
//
// A small one piggybacks on the negotiation instead: each node's ranks' whole send ranges,
// reduced over the node, travel with the cycle that decides it, and every node takes its
// ranks' blocks from them.
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace gradsync::daemon {
namespace {

// Elements [begin, end) of a packed run of blocks (block i of the run is global rank
// `ranks[i]`'s), taken a block at a time: fn(rank index in the run, offset in its block, n).
template <typename Fn>
void for_each_block_part(uint64_t begin, uint64_t end, uint64_t count, Fn&& fn) {
  for (uint64_t at = begin; at < end;) {
    const uint64_t index = at / count;
    const uint64_t within = at % count;
    const uint64_t n = std::min(end - at, count - within);
    fn(index, within, n);
    at += n;
  }
}

}  // namespace

void pack_reduce_scatter_sums(const ReadyCollective& collective, int32_t world_size,
                              std::vector<uint8_t>& contribution) {
  const Submission& lead = collective.first();
  contribution.resize(lead.send_bytes(world_size));
  std::array<const void*, ipc::kMaxLocalRanks> inputs;
  for (size_t r = 0; r < collective.ranks.size(); ++r) inputs[r] = collective.ranks[r].send;
  void* output = contribution.data();
  kernels::reduce_to_all(lead.dtype, node_detail::network_op(lead.op), inputs.data(),
                         collective.ranks.size(), &output, 1,
                         lead.count * static_cast<uint64_t>(world_size), false);
}

NodeResult reduce_scatter_contributions(const ReadyCollective& collective, int32_t world_size,
                                        std::span<const std::span<const uint8_t>> contributions) {
  const Submission& lead = collective.first();
  const uint64_t expected = lead.send_bytes(world_size);
  for (size_t node = 0; node < contributions.size(); ++node) {
    if (contributions[node].size() != expected) {
      return fmt::format("reduce-scatter '{}': node {} sent {} bytes of sums, where {} are due",
                         lead.name, node, contributions[node].size(), expected);
    }
  }
  // Every node adds the same sums in node order: the same bits wherever a block is reduced.
  std::vector<const void*> inputs(contributions.size());
  for (const auto& s : collective.ranks) {
    const uint64_t offset = static_cast<uint64_t>(s.session->identity().rank) * lead.block_bytes();
    for (size_t node = 0; node < contributions.size(); ++node) {
      inputs[node] = contributions[node].data() + offset;
    }
    void* output = s.recv;
    kernels::reduce_to_all(lead.dtype, node_detail::network_op(lead.op), inputs.data(),
                           inputs.size(), &output, 1, lead.count, false);
    if (lead.op == GRADSYNC_AVG) {
      kernels::divide(lead.dtype, s.recv, lead.count, static_cast<uint64_t>(world_size));
    }
  }
  return std::nullopt;
}

NodeTask node_reduce_scatter(CollectiveContext& step, const ReadyCollective& collective,
                             const RankMap& rank_nodes) {
  NodeLinks& links = step.links;
  const Submission& lead = collective.first();
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  const uint64_t count = lead.count;
  const size_t element = ipc::dtype_bytes(lead.dtype);
  const uint64_t block = lead.block_bytes();
  const gradsync_op op = node_detail::network_op(lead.op);
  const std::vector<std::vector<int32_t>> node_ranks =
      node_detail::ranks_by_node(rank_nodes, n, step.world_size);
  const std::vector<int32_t>& mine = node_ranks[me];
  std::vector<const Submission*> local;
  if (auto error = node_detail::in_rank_order(collective, mine, local)) co_return error;
  // Every node cuts a run of K blocks alike: pieces of whole elements, at most kMaxPieces.
  constexpr uint64_t kMaxPieces = 1024;
  const auto piece_elements = [&](size_t blocks) {
    const uint64_t elements = count * blocks;
    return std::max<uint64_t>(
        {cost_model::kPipelinePieceBytes / element, (elements + kMaxPieces - 1) / kMaxPieces, 1});
  };
  auto tag = [&](uint32_t sender, uint32_t piece) {
    return links.tag(tags::kData, sender, step.sequence, piece);
  };

  Flight flight(links, &step.scratch, node_detail::rank_memory(collective),
                "running a reduce-scatter across nodes");
  // What arrives: from each other node, its sums of this node's blocks, in pieces.
  const uint64_t own_elements = count * mine.size();
  const uint64_t own_piece = piece_elements(mine.size());
  const auto own_pieces = static_cast<uint32_t>((own_elements + own_piece - 1) / own_piece);
  uint8_t* arrivals = step.scratch.get(0, (n - 1) * own_elements * element);
  auto arrival = [&](uint32_t node) {
    return arrivals + (node < me ? node : node - 1) * own_elements * element;
  };
  std::vector<std::vector<size_t>> receives(n);
  for (uint32_t node = 0; node < n; ++node) {
    if (node == me) continue;
    for (uint32_t p = 0; p < own_pieces; ++p) {
      const uint64_t begin = p * own_piece;
      const uint64_t end = std::min(own_elements, begin + own_piece);
      receives[node].push_back(flight.add(step.receive(
          tag(node, p), node, arrival(node) + begin * element, (end - begin) * element)));
    }
  }

  // What leaves: each other node's blocks, reduced over this node's ranks into a packed run of
  // its own (slot 1), as its pieces may still be on the wire when the next node's are reduced.
  std::vector<uint64_t> packed_at(n, 0);
  uint64_t packed_elements = 0;
  for (uint32_t node = 0; node < n; ++node) {
    packed_at[node] = packed_elements;
    if (node != me) packed_elements += count * node_ranks[node].size();
  }
  uint8_t* packed_all = nullptr;  // taken from scratch once a node's blocks need packing
  std::array<const void*, ipc::kMaxLocalRanks> inputs;
  for (uint32_t k = 1; k < n; ++k) {
    // Starting to the right, so that not every node sends to node 0 first.
    const uint32_t node = (me + k) % n;
    const std::vector<int32_t>& theirs = node_ranks[node];
    const uint64_t elements = count * theirs.size();
    const uint64_t piece = piece_elements(theirs.size());
    const bool straight = local.size() == 1 && node_detail::consecutive(theirs);
    if (!straight && packed_all == nullptr) {
      packed_all = step.scratch.get(1, packed_elements * element);
    }
    uint8_t* packed = straight ? nullptr : packed_all + packed_at[node] * element;
    for (uint64_t begin = 0, p = 0; begin < elements; begin += piece, ++p) {
      const uint64_t end = std::min(elements, begin + piece);
      const uint8_t* source = nullptr;
      if (straight) {
        source = local[0]->send + (static_cast<uint64_t>(theirs.front()) * count + begin) * element;
      } else {
        for_each_block_part(begin, end, count, [&](uint64_t index, uint64_t within, uint64_t m) {
          const uint64_t at = static_cast<uint64_t>(theirs[index]) * count + within;
          for (size_t r = 0; r < local.size(); ++r) inputs[r] = local[r]->send + at * element;
          void* output = packed + (index * count + within) * element;
          kernels::reduce_to_all(lead.dtype, op, inputs.data(), local.size(), &output, 1, m, false);
        });
        source = packed + begin * element;
        co_await next_round();  // lets the pieces already sent move
      }
      co_await step.pace((end - begin) * element);
      flight.add(
          step.send(node, tag(me, static_cast<uint32_t>(p)), source, (end - begin) * element));
    }
  }

  // Each piece of this node's blocks, once every other node's sums of it are here.
  std::vector<const void*> sums(local.size() + n - 1);
  const bool streaming = block >= kernels::kStreamingMinBytes;
  for (uint32_t p = 0; p < own_pieces; ++p) {
    for (uint32_t node = 0; node < n; ++node) {
      if (node == me) continue;
      if (auto error = co_await flight.wait(receives[node][p])) co_return error;
    }
    const uint64_t begin = p * own_piece;
    const uint64_t end = std::min(own_elements, begin + own_piece);
    for_each_block_part(begin, end, count, [&](uint64_t index, uint64_t within, uint64_t m) {
      const uint64_t at = static_cast<uint64_t>(mine[index]) * count + within;
      size_t inputs_used = 0;
      for (const Submission* s : local) sums[inputs_used++] = s->send + at * element;
      for (uint32_t node = 0; node < n; ++node) {
        if (node != me) sums[inputs_used++] = arrival(node) + (index * count + within) * element;
      }
      uint8_t* result = local[index]->recv + within * element;
      void* output = result;
      kernels::reduce_to_all(lead.dtype, op, sums.data(), inputs_used, &output, 1, m, streaming);
      if (lead.op == GRADSYNC_AVG) {
        kernels::divide(lead.dtype, result, m, static_cast<uint64_t>(step.world_size));
      }
    });
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
