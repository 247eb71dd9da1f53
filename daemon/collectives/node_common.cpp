#include "daemon/collectives/node_collectives.h"

namespace gradsync::daemon {

NodeTask run_allreduce(NodeStep& step, const AllreduceOperand& operand,
                       AllreduceAlgorithm algorithm) {
  return algorithm == AllreduceAlgorithm::kRing ? node_ring_allreduce(step, operand)
                                                : node_halving_doubling_allreduce(step, operand);
}

namespace node_detail {

std::vector<std::shared_ptr<const void>> rank_memory(const ReadyCollective& collective) {
  std::vector<std::shared_ptr<const void>> memory;
  collective.append_memory(memory);
  return memory;
}

}  // namespace node_detail
}  // namespace gradsync::daemon
