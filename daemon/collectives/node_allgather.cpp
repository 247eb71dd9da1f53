// Allgather across nodes: every node sends its ranks' blocks straight from their buffers to
// every other node, and receives the others' blocks into place in a staging buffer; then each
// local rank gets every block.
#include "daemon/collectives/node_collectives.h"
#include "kernels/reduce.h"

#include <algorithm>

namespace gradsync::daemon {

NodeTask node_allgather(NodeStep& step, const ReadyCollective& collective) {
  NodeLinks& links = step.links;
  const Submission& lead = collective.first();
  const uint64_t block = lead.send_bytes();
  const auto world = static_cast<uint32_t>(step.world_size);
  std::vector<const Submission*> local(world, nullptr);  // by global rank
  for (const auto& s : collective.ranks)
    local[static_cast<uint32_t>(s.session->identity().rank)] = &s;
  Flight flight(links, &step.scratch, node_detail::rank_memory(collective),
                "gathering from other nodes");
  uint8_t* staging = step.scratch.get(0, std::max<uint64_t>(block * world, 1));
  for (uint32_t slot = 0; slot < world; ++slot) {
    if (local[slot] == nullptr) {
      flight.add(step.receive(links.tag(tags::kData, 0, step.sequence, slot), std::nullopt,
                              staging + slot * block, block));
    }
  }
  for (const auto& s : collective.ranks) {
    const auto slot = static_cast<uint32_t>(s.session->identity().rank);
    for (uint32_t node = 0; node < links.nodes(); ++node) {
      if (node == links.me()) continue;
      flight.add(
          step.send(node, links.tag(tags::kData, links.me(), step.sequence, slot), s.send, block));
    }
  }
  if (auto error = co_await flight.wait_all()) co_return error;
  const bool streaming = block * world >= kernels::kStreamingMinBytes;
  for (const auto& target : collective.ranks) {
    for (uint32_t slot = 0; slot < world; ++slot) {
      uint8_t* destination = target.recv + slot * block;
      const uint8_t* source = local[slot] != nullptr ? local[slot]->send : staging + slot * block;
      // In place, a rank's own slot is already there.
      if (destination != source) kernels::copy(destination, source, block, streaming);
    }
  }
  co_return std::nullopt;
}

}  // namespace gradsync::daemon
