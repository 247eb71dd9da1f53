// Measures the cost-model figures when a multi-node job forms: α and β on the links, as a ring
// exchange every node of the job runs at the same point (so each node measures its link to
// the left-hand neighbour, the way a ring step uses it), and γ on this node's cores.
#pragma once

#include "daemon/collectives/node_collectives.h"
#include "daemon/node/negotiator.h"

namespace gradsync::daemon {

// A task that refers to its arguments until it ends.
NodeTask probe_links(NodeLinks& links, Scratch& scratch, LinkFigures& figures);

}  // namespace gradsync::daemon
