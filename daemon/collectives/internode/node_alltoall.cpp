// All-to-all across nodes: one stream between each pair of nodes, carrying every block this
// node's ranks address to the other node's ranks (destination rank by destination rank, each
// with its sources in rank order), so a node sends to n-1 nodes however many ranks each node
// has, never rank to rank. The blocks between this node's own ranks are copied while the
// streams travel.
//
// In rounds, as the reduce-scatter runs: each stream is cut into pieces, round q sends every
// other node piece q of its stream and unpacks piece q - 1 of every stream arriving, and a
// node holds a window of pieces of what it packs and of what arrives
// (node_detail::kWindowPieces), not the whole. Where this node has one rank and the other
// node's ranks are consecutive (the usual placement), a stream leaves straight from the rank's
// send range and lands straight in its receive range: no copy, no window.
//
// A small one piggybacks on the negotiation instead: each node's ranks' whole send ranges
// travel with the cycle that decides it, and every node takes its ranks' blocks from them.
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace gradsync::daemon {
NodeResult alltoall_contributions(const ReadyCollective& collective, const RankMap& rank_nodes,
                                  int32_t world_size,
                                  std::span<const std::span<const uint8_t>> contributions) {
  const Submission& lead = collective.first();
  const uint64_t block = lead.block_bytes();
  const uint64_t range = lead.send_bytes(world_size);
  const auto node_ranks = node_detail::ranks_by_node(
      rank_nodes, static_cast<uint32_t>(contributions.size()), world_size);
  for (size_t node = 0; node < contributions.size(); ++node) {
    if (contributions[node].size() != range * node_ranks[node].size()) {
      return fmt::format(
          "all-to-all '{}': node {} sent {} bytes of blocks, where its ranks have {}", lead.name,
          node, contributions[node].size(), range * node_ranks[node].size());
    }
  }
  for (const auto& target : collective.ranks) {
    const auto to = static_cast<uint64_t>(target.session->identity().rank);
    for (size_t node = 0; node < contributions.size(); ++node) {
      const std::vector<int32_t>& sources = node_ranks[node];
      for (size_t i = 0; i < sources.size(); ++i) {
        std::memcpy(target.recv + static_cast<uint64_t>(sources[i]) * block,
                    contributions[node].data() + i * range + to * block, block);
      }
    }
  }
  return std::nullopt;
}

NodeTask node_alltoall(CollectiveContext& step, const ReadyCollective& collective,
                       const RankMap& rank_nodes) {
  NodeLinks& links = step.links;
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  const uint64_t block = collective.first().block_bytes();
  if (block == 0) co_return std::nullopt;  // every node has the agreed count: all skip alike
  using node_detail::for_each_block_part;
  using node_detail::PieceCut;
  const std::vector<std::vector<int32_t>> node_ranks =
      node_detail::ranks_by_node(rank_nodes, n, step.world_size);
  const std::vector<int32_t>& mine = node_ranks[me];
  std::vector<const Submission*> local;
  if (auto error = node_detail::in_rank_order(collective, mine, local)) co_return error;
  auto local_of = [&](int32_t rank) {
    return local[static_cast<size_t>(std::find(mine.begin(), mine.end(), rank) - mine.begin())];
  };
  auto tag = [&](uint32_t sender, uint64_t piece) {
    return links.tag(tags::kData, sender, step.sequence, static_cast<uint32_t>(piece));
  };

  // The stream with each other node, the same length and cut alike both ways (|mine| x
  // |theirs| blocks); its slots in scratch, for what is packed (slot 1) and what lands to be
  // unpacked (slot 0), unless it goes straight.
  struct Stream {
    PieceCut cut{0, 1};
    bool straight = false;
    uint64_t slots_at = 0;
    std::vector<size_t> sends;     // the flight's send of piece p
    std::vector<size_t> receives;  // the flight's receive of piece p
  };
  std::vector<Stream> streams(n);
  uint64_t scratch_bytes = 0;
  uint64_t rounds = 0;
  for (uint32_t node = 0; node < n; ++node) {
    if (node == me) continue;
    Stream& stream = streams[node];
    stream.cut = PieceCut(block * mine.size() * node_ranks[node].size(), step.piece_bytes);
    stream.straight = local.size() == 1 && node_detail::consecutive(node_ranks[node]);
    stream.slots_at = scratch_bytes;
    if (!stream.straight) scratch_bytes += stream.cut.slots * stream.cut.piece;
    rounds = std::max(rounds, stream.cut.pieces);
  }
  uint8_t* arrivals = scratch_bytes > 0 ? step.scratch.get(0, scratch_bytes) : nullptr;
  uint8_t* packed = scratch_bytes > 0 ? step.scratch.get(1, scratch_bytes) : nullptr;
  auto slot = [&](uint8_t* slots, const Stream& stream, uint64_t p) {
    return slots + stream.slots_at + (p % stream.cut.slots) * stream.cut.piece;
  };

  Flight flight(links, &step.scratch, node_detail::rank_memory(collective),
                "running an all-to-all across nodes");
  // A straight stream's pieces land in place, all posted at once; the others' in a window.
  auto expect_piece = [&](uint32_t node, uint64_t p) {
    Stream& stream = streams[node];
    const auto [begin, end] = stream.cut.range(p);
    uint8_t* landing =
        stream.straight
            ? local[0]->recv + static_cast<uint64_t>(node_ranks[node].front()) * block + begin
            : slot(arrivals, stream, p);
    stream.receives.push_back(flight.add(step.receive(tag(node, p), node, landing, end - begin)));
  };
  for (uint32_t node = 0; node < n; ++node) {
    if (node == me) continue;
    const Stream& stream = streams[node];
    const uint64_t ahead = stream.straight ? stream.cut.pieces : stream.cut.slots;
    for (uint64_t p = 0; p < ahead; ++p) expect_piece(node, p);
  }

  // Round q sends every other node piece q of its stream, then unpacks piece q - 1 of every
  // stream arriving (kWindowPieces says why every piece finds its receive posted). A packed
  // slot is packed again once the piece sent from it, four rounds before, has left.
  for (uint64_t q = 0; q <= rounds; ++q) {
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t node = (me + k) % n;  // to the right first, so not everyone starts at 0
      Stream& stream = streams[node];
      if (q >= stream.cut.pieces) continue;
      const std::vector<int32_t>& theirs = node_ranks[node];
      const uint64_t begin = stream.cut.range(q).first;  // not a binding: the lambda takes it
      const uint64_t end = stream.cut.range(q).second;
      const uint8_t* source = nullptr;
      if (stream.straight) {
        source = local[0]->send + static_cast<uint64_t>(theirs.front()) * block + begin;
      } else {
        uint8_t* piece = slot(packed, stream, q);
        if (q >= stream.cut.slots) {
          if (auto error = co_await flight.wait(stream.sends[q - stream.cut.slots])) {
            co_return error;
          }
        }
        // Block i of the stream is from mine[i % |mine|] to theirs[i / |mine|].
        for_each_block_part(begin, end, block, [&](uint64_t index, uint64_t within, uint64_t m) {
          const int32_t from = mine[index % mine.size()];
          const auto to = static_cast<uint64_t>(theirs[index / mine.size()]);
          std::memcpy(piece + index * block + within - begin,
                      local_of(from)->send + to * block + within, m);
        });
        source = piece;
      }
      co_await step.pace(end - begin);
      stream.sends.push_back(flight.add(step.send(node, tag(me, q), source, end - begin)));
    }
    if (q == 0) {
      // The blocks between this node's own ranks, while the first pieces travel.
      for (const Submission* from : local) {
        for (const Submission* to : local) {
          const auto from_rank = static_cast<uint64_t>(from->session->identity().rank);
          const auto to_rank = static_cast<uint64_t>(to->session->identity().rank);
          std::memcpy(to->recv + from_rank * block, from->send + to_rank * block, block);
        }
      }
      continue;
    }
    const uint64_t p = q - 1;
    for (uint32_t node = 0; node < n; ++node) {
      if (node == me) continue;
      const Stream& stream = streams[node];
      if (p >= stream.cut.pieces) continue;
      if (auto error = co_await flight.wait(stream.receives[p])) co_return error;
      if (stream.straight) continue;
      const std::vector<int32_t>& theirs = node_ranks[node];
      const uint8_t* piece = slot(arrivals, stream, p);
      const uint64_t begin = stream.cut.range(p).first;
      const uint64_t end = stream.cut.range(p).second;
      // Block i of the arriving stream is from theirs[i % |theirs|] to mine[i / |theirs|].
      for_each_block_part(begin, end, block, [&](uint64_t index, uint64_t within, uint64_t m) {
        const auto from = static_cast<uint64_t>(theirs[index % theirs.size()]);
        const int32_t to = mine[index / theirs.size()];
        std::memcpy(local_of(to)->recv + from * block + within,
                    piece + index * block + within - begin, m);
      });
      if (p + stream.cut.slots < stream.cut.pieces) expect_piece(node, p + stream.cut.slots);
    }
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
