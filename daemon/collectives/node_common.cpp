#include "daemon/collectives/node_collectives.h"
#include "kernels/reduce.h"

#include <algorithm>

namespace gradsync::daemon {

NodeTask run_allreduce(CollectiveContext& step, const AllreduceOperand& operand,
                       AllreduceAlgorithm algorithm) {
  return algorithm == AllreduceAlgorithm::kRing ? node_ring_allreduce(step, operand)
                                                : node_halving_doubling_allreduce(step, operand);
}

NodeTask run_broadcast(CollectiveContext& step, const ReadyCollective& collective,
                       std::optional<uint32_t> root_node, BroadcastAlgorithm algorithm) {
  return algorithm == BroadcastAlgorithm::kChain && root_node
             ? node_chain_broadcast(step, collective, *root_node)
             : node_direct_broadcast(step, collective, root_node);
}

namespace node_detail {

const Submission* root_of(const ReadyCollective& collective) {
  for (const auto& s : collective.ranks) {
    if (s.session->identity().rank == collective.first().root) return &s;
  }
  return nullptr;
}

NodeTask copy_between_rounds(uint8_t* destination, const uint8_t* source, uint64_t bytes,
                             bool streaming) {
  for (uint64_t at = 0; at < bytes; at += kPipelinePieceBytes) {
    if (at > 0) co_await next_round();
    kernels::copy(destination + at, source + at, std::min(kPipelinePieceBytes, bytes - at),
                  streaming);
  }
  co_return std::nullopt;
}

std::vector<std::shared_ptr<const void>> rank_memory(const ReadyCollective& collective) {
  std::vector<std::shared_ptr<const void>> memory;
  collective.append_memory(memory);
  return memory;
}

}  // namespace node_detail
}  // namespace gradsync::daemon
