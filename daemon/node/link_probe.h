// Measures the cost-model figures when a multi-node job forms: α and β on the links, as a ring
// exchange every node of the job runs at the same point (so each node measures its link to
// the left-hand neighbour, the way a ring step uses it), and γ on this node's cores.
#pragma once

#include "daemon/collectives/internode/node_collectives.h"
#include "daemon/node/negotiator.h"

#include <vector>

namespace gradsync::daemon {

// α and β from the probe's timed rounds (seconds per round): small rounds carry a few bytes,
// large ones `large_bytes`. Zero figures where a kind of round is missing.
cost_model::LinkFigures link_figures_from_rounds(const std::vector<double>& small_seconds,
                                                 const std::vector<double>& large_seconds,
                                                 size_t large_bytes);

// A task that refers to its arguments until it ends.
NodeTask probe_links(NodeLinks& links, Scratch& scratch, cost_model::LinkFigures& figures);

}  // namespace gradsync::daemon
