// Broadcast across nodes, direct: the root's node sends the root's buffer straight to every
// other node, into its first local rank's buffer (no staging copy on either side), and each
// node copies it to its other local ranks.
// One step: the latency-optimal broadcast, with n-1 copies on the root's link (cost_model.h).
// A small one piggybacks on the negotiation instead: the root's data goes with its node's part of
// the cycle that decides it.
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>

namespace gradsync::daemon {

NodeResult broadcast_contributions(const ReadyCollective& collective, const RankMap& rank_nodes,
                                   std::span<const std::span<const uint8_t>> contributions) {
  const Submission& lead = collective.first();
  const uint64_t bytes = lead.block_bytes();
  const std::optional<uint32_t> root_node = rank_nodes.node_of(lead.root);
  if (!root_node || *root_node >= contributions.size()) {
    return fmt::format("broadcast '{}': its root, rank {}, is on no node that sent data", lead.name,
                       lead.root);
  }
  for (size_t node = 0; node < contributions.size(); ++node) {
    const uint64_t due = node == *root_node ? bytes : 0;
    if (contributions[node].size() != due) {
      return fmt::format(
          "broadcast '{}': node {} sent {} bytes with the negotiation, where {} were "
          "due (its root, rank {}, is on node {})",
          lead.name, node, contributions[node].size(), due, lead.root, *root_node);
    }
  }
  // Every rank's result, but where it is the root's data in place.
  const Submission* root = node_detail::root_of(collective);
  const uint8_t* source = contributions[*root_node].data();
  for (const auto& s : collective.ranks) {
    if (root == nullptr || s.recv != root->send) kernels::copy(s.recv, source, bytes, false);
  }
  return std::nullopt;
}

NodeTask node_direct_broadcast(CollectiveContext& step, const ReadyCollective& collective,
                               std::optional<uint32_t> root_node) {
  NodeLinks& links = step.links;
  const uint64_t bytes = collective.first().block_bytes();
  const Submission* root = node_detail::root_of(collective);
  Flight flight(links, &step.scratch, node_detail::rank_memory(collective),
                root != nullptr ? "broadcasting to other nodes" : "receiving a broadcast");
  const uint8_t* source = nullptr;
  if (root != nullptr) {
    for (uint32_t node = 0; node < links.nodes(); ++node) {
      if (node == links.me()) continue;
      co_await step.pace(bytes);
      flight.add(
          step.send(node, links.tag(tags::kData, links.me(), step.sequence, 0), root->send, bytes));
    }
    source = root->send;
  } else {
    // Straight into the first local rank's buffer, the others' copies from there.
    uint8_t* landing = collective.ranks.front().recv;
    // From the root's node; where it is not known, from whichever node sends the tag.
    flight.add(step.receive(links.tag(tags::kData, root_node.value_or(0), step.sequence, 0),
                            root_node, landing, bytes));
    if (auto error = co_await flight.wait_all()) co_return error;
    source = landing;
  }
  // The root's node copies to its other ranks while its sends are on the wire, a piece between
  // engine rounds so that the sends go on.
  const bool streaming = bytes >= kernels::kStreamingMinBytes;
  for (const auto& s : collective.ranks) {
    if (s.recv == source) continue;
    NodeTask copying = node_detail::copy_between_rounds(s.recv, source, bytes, streaming);
    co_await finish(copying);
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
