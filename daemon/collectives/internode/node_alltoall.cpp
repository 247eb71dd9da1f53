// All-to-all across nodes: one message per pair of nodes, carrying every block this node's
// ranks address to the other node's ranks (destination rank by destination rank, each with its
// sources in rank order), so a node sends n-1 messages however many ranks each node has. The
// blocks between this node's own ranks are copied while the messages travel.
//
// Where this node has one rank and the other node's ranks are consecutive (the usual
// placement), a message leaves straight from the rank's send range and lands straight in its
// receive range; otherwise it is packed into scratch and unpacked from it.
//
// A small one piggybacks on the negotiation instead: each node's ranks' whole send ranges
// travel with the cycle that decides it, and every node takes its ranks' blocks from them.
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace gradsync::daemon {
namespace {

// Walks the blocks of the message between a node whose ranks are `sources` and one whose ranks
// are `targets`, in message order: fn(offset in the message, source rank, target rank).
template <typename Fn>
void for_each_message_block(const std::vector<int32_t>& sources,
                            const std::vector<int32_t>& targets, uint64_t block, Fn&& fn) {
  uint64_t offset = 0;
  for (const int32_t target : targets) {
    for (const int32_t source : sources) {
      fn(offset, source, target);
      offset += block;
    }
  }
}

}  // namespace

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
  const std::vector<std::vector<int32_t>> node_ranks =
      node_detail::ranks_by_node(rank_nodes, n, step.world_size);
  const std::vector<int32_t>& mine = node_ranks[me];
  std::vector<const Submission*> local;
  if (auto error = node_detail::in_rank_order(collective, mine, local)) co_return error;
  auto local_of = [&](int32_t rank) {
    return local[static_cast<size_t>(std::find(mine.begin(), mine.end(), rank) - mine.begin())];
  };
  // Straight from and into a lone local rank's ranges, where the other node's ranks are a run.
  auto straight = [&](uint32_t node) {
    return local.size() == 1 && node_detail::consecutive(node_ranks[node]);
  };
  auto message_bytes = [&](uint32_t node) { return block * mine.size() * node_ranks[node].size(); };
  auto tag = [&](uint32_t sender) { return links.tag(tags::kData, sender, step.sequence, 0); };

  // Scratch for what is packed (slot 1) and what lands to be unpacked (slot 0), by node.
  std::vector<uint64_t> scratch_at(n, 0);
  uint64_t scratch_bytes = 0;
  for (uint32_t node = 0; node < n; ++node) {
    scratch_at[node] = scratch_bytes;
    if (node != me && !straight(node)) scratch_bytes += message_bytes(node);
  }
  uint8_t* arrivals = scratch_bytes > 0 ? step.scratch.get(0, scratch_bytes) : nullptr;
  uint8_t* packed = scratch_bytes > 0 ? step.scratch.get(1, scratch_bytes) : nullptr;

  Flight flight(links, &step.scratch, node_detail::rank_memory(collective),
                "running an all-to-all across nodes");
  std::vector<size_t> receives(n, 0);
  for (uint32_t node = 0; node < n; ++node) {
    if (node == me) continue;
    uint8_t* landing =
        straight(node) ? local[0]->recv + static_cast<uint64_t>(node_ranks[node].front()) * block
                       : arrivals + scratch_at[node];
    receives[node] = flight.add(step.receive(tag(node), node, landing, message_bytes(node)));
  }
  for (uint32_t k = 1; k < n; ++k) {
    const uint32_t node = (me + k) % n;  // to the right first, so not everyone starts at 0
    const uint8_t* source = nullptr;
    if (straight(node)) {
      source = local[0]->send + static_cast<uint64_t>(node_ranks[node].front()) * block;
    } else {
      uint8_t* message = packed + scratch_at[node];
      for_each_message_block(
          mine, node_ranks[node], block, [&](uint64_t offset, int32_t from, int32_t to) {
            std::memcpy(message + offset, local_of(from)->send + static_cast<uint64_t>(to) * block,
                        block);
          });
      source = message;
    }
    co_await step.pace(message_bytes(node));
    flight.add(step.send(node, tag(me), source, message_bytes(node)));
  }
  // The blocks between this node's own ranks, while the messages travel.
  for (const Submission* from : local) {
    for (const Submission* to : local) {
      const auto from_rank = static_cast<uint64_t>(from->session->identity().rank);
      const auto to_rank = static_cast<uint64_t>(to->session->identity().rank);
      std::memcpy(to->recv + from_rank * block, from->send + to_rank * block, block);
    }
  }
  for (uint32_t node = 0; node < n; ++node) {
    if (node == me) continue;
    if (auto error = co_await flight.wait(receives[node])) co_return error;
    if (straight(node)) continue;
    const uint8_t* message = arrivals + scratch_at[node];
    for_each_message_block(node_ranks[node], mine, block,
                           [&](uint64_t offset, int32_t from, int32_t to) {
                             std::memcpy(local_of(to)->recv + static_cast<uint64_t>(from) * block,
                                         message + offset, block);
                           });
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
