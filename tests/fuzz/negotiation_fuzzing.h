// What the fuzz targets of messages between node daemons share: one node of a job reads frames
// said to come from its peers (fuzz_node_message: node 0 of two nodes that send their cycles
// directly; fuzz_relayed_message: node 1 of five that relay them). Any sequence of frames
// either decodes and passes the negotiator's checks, or is refused with an error (which fails
// the job). Whatever the peers send, the node decides only what it proposed itself, each once,
// with one contribution per node where they piggybacked.
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

// The job this target's node reads for: each target file defines it, and the harness
// (negotiation_fuzzing.cpp) provides LLVMFuzzerTestOneInput and seeds() for it.
extern const NegotiationShape kFuzzedShape;

}  // namespace gradsync::fuzz
