// Reduce-scatter across nodes, direct: every node reduces, over its own ranks, the blocks that
// belong to another node's ranks and sends them to that node; it receives every other node's
// partial sums of its own ranks' blocks and reduces them, with its ranks' inputs, straight into
// each local rank's receive range. A node sends and receives (n-1)/n of a rank's send range
// once: the bytes of a ring's reduce-scatter, in one step instead of n-1.
//
// Pipelined, in rounds: what goes to a node is cut into pieces, each reduced and sent while
// the next is reduced, and each arriving piece is reduced into the results as soon as it is
// there from every node. A node holds a window of pieces of what arrives and of what it packs
// (node_detail::kWindowPieces), not the whole. A node with one local rank sends that rank's
// blocks straight from its buffer where the receiving node's ranks are consecutive (the usual
// placement): no copy.
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
  using node_detail::for_each_block_part;
  using node_detail::PieceCut;

  // A node's blocks (a run of count elements per rank of it), cut alike on every node.
  auto run_of = [&](uint32_t node) {
    return PieceCut(count * node_ranks[node].size(), step.piece_bytes / element);
  };
  auto tag = [&](uint32_t sender, uint64_t piece) {
    return links.tag(tags::kData, sender, step.sequence, static_cast<uint32_t>(piece));
  };

  Flight flight(links, &step.scratch, node_detail::rank_memory(collective),
                "running a reduce-scatter across nodes");
  // What arrives: from each other node, its sums of this node's blocks, a window of pieces
  // (slot 0).
  const PieceCut own = run_of(me);
  uint8_t* arrivals =
      step.scratch.get(0, std::max<uint64_t>((n - 1) * own.slots * own.piece * element, 1));
  auto arrival = [&](uint32_t node, uint64_t p) {
    return arrivals +
           ((node < me ? node : node - 1) * own.slots + p % own.slots) * own.piece * element;
  };
  std::vector<std::vector<size_t>> receives(n);  // by node, the flight's receive of piece p
  auto expect_piece = [&](uint64_t p) {
    const auto [begin, end] = own.range(p);
    for (uint32_t node = 0; node < n; ++node) {
      if (node == me) continue;
      receives[node].push_back(
          flight.add(step.receive(tag(node, p), node, arrival(node, p), (end - begin) * element)));
    }
  };
  for (uint64_t p = 0; p < own.slots; ++p) expect_piece(p);

  // What leaves: each other node's blocks reduced over this node's ranks, a piece at a time,
  // into a window of slots of its own (slot 1): a slot is packed again once the piece sent
  // from it has left. With one local rank and the other node's ranks consecutive (the usual
  // placement), straight from that rank's buffer instead: no copy.
  struct Outgoing {
    PieceCut run{0, 1};
    bool straight = false;
    uint64_t packed_at = 0;     // its slots' first element in slot 1
    std::vector<size_t> sends;  // the flight's send of piece p
  };
  std::vector<Outgoing> outgoing(n);
  uint64_t packed_elements = 0;
  for (uint32_t node = 0; node < n; ++node) {
    if (node == me) continue;
    Outgoing& out = outgoing[node];
    out.run = run_of(node);
    out.straight = local.size() == 1 && node_detail::consecutive(node_ranks[node]);
    out.packed_at = packed_elements;
    if (!out.straight) packed_elements += out.run.slots * out.run.piece;
  }
  uint8_t* packed = packed_elements > 0 ? step.scratch.get(1, packed_elements * element) : nullptr;
  uint64_t rounds = own.pieces;
  for (const Outgoing& out : outgoing) rounds = std::max(rounds, out.run.pieces);

  std::array<const void*, ipc::kMaxLocalRanks> inputs;
  std::vector<const void*> sums(local.size() + n - 1);
  const bool streaming = block >= kernels::kStreamingMinBytes;
  // Round q sends every other node piece q of its blocks, then reduces piece q - 1 of this
  // node's, whose sums are all there: the links carry one piece while the one before it is
  // reduced (kWindowPieces says why every piece finds its receive posted). A packed slot's
  // last send, of piece q - 4, was to a node that has since reduced its piece q - 3 and so
  // posted that receive long ago: waiting for it waits for the wire alone.
  for (uint64_t q = 0; q <= rounds; ++q) {
    for (uint32_t k = 1; k < n; ++k) {
      // Starting to the right, so that not every node sends to node 0 first.
      const uint32_t node = (me + k) % n;
      Outgoing& out = outgoing[node];
      if (q >= out.run.pieces) continue;
      const std::vector<int32_t>& theirs = node_ranks[node];
      const uint64_t begin = out.run.range(q).first;  // not a binding: the lambdas below take it
      const uint64_t end = out.run.range(q).second;
      const uint8_t* source = nullptr;
      if (out.straight) {
        source = local[0]->send + (static_cast<uint64_t>(theirs.front()) * count + begin) * element;
      } else {
        uint8_t* slot = packed + (out.packed_at + (q % out.run.slots) * out.run.piece) * element;
        if (q >= out.run.slots) {
          if (auto error = co_await flight.wait(out.sends[q - out.run.slots])) co_return error;
        }
        for_each_block_part(begin, end, count, [&](uint64_t index, uint64_t within, uint64_t m) {
          const uint64_t at = static_cast<uint64_t>(theirs[index]) * count + within;
          for (size_t r = 0; r < local.size(); ++r) inputs[r] = local[r]->send + at * element;
          void* output = slot + (index * count + within - begin) * element;
          kernels::reduce_to_all(lead.dtype, op, inputs.data(), local.size(), &output, 1, m, false);
        });
        source = slot;
        co_await next_round();  // lets the pieces already sent move
      }
      co_await step.pace((end - begin) * element);
      out.sends.push_back(flight.add(step.send(node, tag(me, q), source, (end - begin) * element)));
    }
    if (q == 0 || q - 1 >= own.pieces) continue;
    const uint64_t p = q - 1;
    for (uint32_t node = 0; node < n; ++node) {
      if (node == me) continue;
      if (auto error = co_await flight.wait(receives[node][p])) co_return error;
    }
    const uint64_t begin = own.range(p).first;
    const uint64_t end = own.range(p).second;
    for_each_block_part(begin, end, count, [&](uint64_t index, uint64_t within, uint64_t m) {
      const uint64_t at = static_cast<uint64_t>(mine[index]) * count + within;
      const uint64_t in_piece = index * count + within - begin;
      size_t inputs_used = 0;
      for (const Submission* s : local) sums[inputs_used++] = s->send + at * element;
      for (uint32_t node = 0; node < n; ++node) {
        if (node != me) sums[inputs_used++] = arrival(node, p) + in_piece * element;
      }
      uint8_t* result = local[index]->recv + within * element;
      void* output = result;
      kernels::reduce_to_all(lead.dtype, op, sums.data(), inputs_used, &output, 1, m, streaming);
      if (lead.op == GRADSYNC_AVG) {
        kernels::divide(lead.dtype, result, m, static_cast<uint64_t>(step.world_size));
      }
    });
    if (p + own.slots < own.pieces) expect_piece(p + own.slots);  // into the slot just reduced
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
