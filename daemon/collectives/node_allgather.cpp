// Allgather across nodes: every node sends its ranks' blocks straight from their buffers to
// every other node, and receives the others' blocks in place in its first local rank's
// buffer (no staging copy); then the node's own blocks join them there, and the other local
// ranks get the whole.
#include "daemon/collectives/node_collectives.h"
#include "kernels/reduce.h"

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
  uint8_t* landing = collective.ranks.front().recv;
  for (uint32_t slot = 0; slot < world; ++slot) {
    if (local[slot] == nullptr) {
      flight.add(step.receive(links.tag(tags::kData, 0, step.sequence, slot), std::nullopt,
                              landing + slot * block, block));
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
  // Every send must be done before a local rank's buffer is written: in place, a rank sends
  // its block from inside its result.
  if (auto error = co_await flight.wait_all()) co_return error;
  const bool streaming = block * world >= kernels::kStreamingMinBytes;
  for (const auto& s : collective.ranks) {
    uint8_t* destination = landing + static_cast<uint32_t>(s.session->identity().rank) * block;
    if (destination != s.send) kernels::copy(destination, s.send, block, streaming);
  }
  for (const auto& target : collective.ranks) {
    if (target.recv != landing) kernels::copy(target.recv, landing, block * world, streaming);
  }
  co_return std::nullopt;
}

}  // namespace gradsync::daemon
