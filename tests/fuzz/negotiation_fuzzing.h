// What the fuzz targets of messages between node daemons share: one node of a job reads frames
// said to come from its peers (fuzz_node_message: node 0 of two nodes that send their cycles
// directly; fuzz_relayed_message: node 1 of five that relay them). Any sequence of frames
// either decodes and passes the negotiator's checks, or is refused with an error (which fails
// the job). Whatever the peers send, the node decides only what it proposed itself, each once,
// with one contribution per node where they rode along.
#pragma once

#include "daemon/node/negotiator.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradsync::fuzz {

struct NegotiationShape {
  uint32_t nodes;
  uint32_t me;  // the node that reads the frames
  daemon::CycleRoute route;
};

// Runs the frames of `data` (each a 4-byte length, then that many bytes of a Cap'n Proto
// message) through node `shape.me`, which has proposed the same collectives as in seeds_for.
void read_frames(const NegotiationShape& shape, const uint8_t* data, size_t size);

// What node `shape.me` reads in a real exchange, every node proposing the same collectives and
// the messages delivered until no node has more to say: the whole conversation, framed, and
// its first message alone.
std::vector<std::vector<uint8_t>> seeds_for(const NegotiationShape& shape);

}  // namespace gradsync::fuzz
