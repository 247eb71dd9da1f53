// Messages from another node daemon, as node 0 of a two-node job that sends its cycles
// directly reads them (negotiation_fuzzing.h).
#include "tests/fuzz/negotiation_fuzzing.h"

const gradsync::fuzz::NegotiationShape gradsync::fuzz::kFuzzedShape{
    2, 0, gradsync::daemon::CycleRoute::kDirect};
