// Messages from the other node daemons of a five-node job that relays its cycles, as node 1
// reads them (negotiation_fuzzing.h): it exchanges parts with nodes 0 and 3.
#include "tests/fuzz/negotiation_fuzzing.h"

const gradsync::fuzz::NegotiationShape gradsync::fuzz::kFuzzedShape{
    5, 1, gradsync::daemon::CycleRoute::kRelayed};
