// Messages from the other node daemons of a five-node job that relays its cycles, as node 1
// reads them (negotiation_fuzzing.h): it exchanges parts with nodes 0 and 3, hears node 0's
// answers from node 0 and passes them on to node 3.
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/negotiation_fuzzing.h"

namespace {

constexpr gradsync::fuzz::NegotiationShape kShape{5, 1, gradsync::daemon::CycleRoute::kRelayed};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gradsync::fuzz::read_frames(kShape, data, size);
  return 0;
}

namespace gradsync::fuzz {

std::vector<std::vector<uint8_t>> seeds() {
  return seeds_for(kShape);
}

}  // namespace gradsync::fuzz
