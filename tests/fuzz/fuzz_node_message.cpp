// Messages from another node daemon, as node 0 of a two-node job that sends its cycles
// directly reads them (negotiation_fuzzing.h).
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/negotiation_fuzzing.h"

namespace {

constexpr gradsync::fuzz::NegotiationShape kShape{2, 0, gradsync::daemon::CycleRoute::kDirect};

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
