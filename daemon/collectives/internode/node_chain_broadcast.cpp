// Broadcast across nodes along a chain (NCCL's ring broadcast): the root's node sends the
// buffer in pieces to the next node in node order, which sends each piece on as it lands, and
// so on around the ring to the node before the root's. Every link carries the buffer once,
// wherever the root is, where the direct broadcast puts n-1 copies on the root's own link; the
// pipeline fills in n-2 pieces' time (cost_model.h).
//
// A piece lands in the first local rank's own buffer and leaves from there: a node on the way
// copies nothing. The node's other ranks get each piece while the later ones travel.
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

namespace gradsync::daemon {

NodeTask node_chain_broadcast(CollectiveContext& step, const ReadyCollective& collective,
                              uint32_t root_node) {
  NodeLinks& links = step.links;
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  const uint32_t next = (me + 1) % n;
  const uint32_t previous = (me + n - 1) % n;
  const Submission* root = node_detail::root_of(collective);
  if ((root != nullptr) != (me == root_node)) {
    co_return fmt::format("node {} was told the broadcast's root rank {} is on node {}", me,
                          collective.first().root, root_node);
  }
  const uint64_t bytes = collective.first().block_bytes();
  // Every node cuts the same pieces: they depend on the size only.
  const uint32_t pieces = cost_model::chain_broadcast_pieces(bytes);
  auto begin = [&](uint32_t j) { return bytes * j / pieces; };
  auto length = [&](uint32_t j) { return begin(j + 1) - begin(j); };
  auto tag = [&](uint32_t sender, uint32_t j) {
    return links.tag(tags::kData, sender, step.sequence, j);
  };

  Flight flight(links, &step.scratch, node_detail::rank_memory(collective),
                "broadcasting along the chain of nodes");
  uint8_t* landing = root != nullptr ? nullptr : collective.ranks.front().recv;
  const uint8_t* source = root != nullptr ? root->send : landing;
  std::vector<size_t> arrivals;
  if (root == nullptr) {
    for (uint32_t j = 0; j < pieces; ++j) {
      arrivals.push_back(
          flight.add(step.receive(tag(previous, j), previous, landing + begin(j), length(j))));
    }
  }
  const bool forwards = next != root_node;  // the chain ends on the node before the root's
  const bool streaming = bytes >= kernels::kStreamingMinBytes;
  for (uint32_t j = 0; j < pieces; ++j) {
    if (root == nullptr) {
      if (auto error = co_await flight.wait(arrivals[j])) co_return error;
    }
    if (forwards) {
      co_await step.pace(length(j));
      flight.add(step.send(next, tag(me, j), source + begin(j), length(j)));
    }
    for (const auto& s : collective.ranks) {
      if (s.recv != source)
        kernels::copy(s.recv + begin(j), source + begin(j), length(j), streaming);
    }
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
