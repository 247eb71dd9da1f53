#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>

namespace gradsync::daemon {

NodeTask run_allreduce(CollectiveContext& step, const AllreduceOperand& operand,
                       cost_model::AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case cost_model::AllreduceAlgorithm::kRing:
      return node_ring_allreduce(step, operand);
    case cost_model::AllreduceAlgorithm::kAggregate:
      return node_aggregate_allreduce(step, operand);
    case cost_model::AllreduceAlgorithm::kSplit:
      return node_split_allreduce(step, operand);
    case cost_model::AllreduceAlgorithm::kDirect:
      return node_direct_allreduce(step, operand);
    case cost_model::AllreduceAlgorithm::kHalvingDoubling:
      break;
  }
  return node_halving_doubling_allreduce(step, operand);
}

NodeTask run_broadcast(CollectiveContext& step, const ReadyCollective& collective,
                       std::optional<uint32_t> root_node,
                       cost_model::BroadcastAlgorithm algorithm) {
  return algorithm == cost_model::BroadcastAlgorithm::kChain && root_node
             ? node_chain_broadcast(step, collective, *root_node)
             : node_direct_broadcast(step, collective, root_node);
}

namespace node_detail {

PieceCut::PieceCut(uint64_t units, uint64_t wanted_piece)
    : units(units),
      // No longer than the whole: a slot holds a piece.
      piece(std::max<uint64_t>(
          std::min(units,
                   std::max(wanted_piece, (units + kMaxWindowedPieces - 1) / kMaxWindowedPieces)),
          1)),
      pieces((units + piece - 1) / piece),
      slots(std::min(pieces, kWindowPieces)) {}

const Submission* root_of(const ReadyCollective& collective) {
  for (const auto& s : collective.ranks) {
    if (s.session->identity().rank == collective.first().root) return &s;
  }
  return nullptr;
}

NodeTask copy_between_rounds(uint8_t* destination, const uint8_t* source, uint64_t bytes,
                             bool streaming) {
  for (uint64_t at = 0; at < bytes; at += cost_model::kPipelinePieceBytes) {
    if (at > 0) co_await next_round();
    kernels::copy(destination + at, source + at,
                  std::min(cost_model::kPipelinePieceBytes, bytes - at), streaming);
  }
  co_return std::nullopt;
}

std::vector<std::vector<int32_t>> ranks_by_node(const RankMap& rank_nodes, uint32_t nodes,
                                                int32_t world_size) {
  std::vector<std::vector<int32_t>> ranks(nodes);
  for (int32_t rank = 0; rank < world_size; ++rank) {
    if (const auto node = rank_nodes.node_of(rank); node && *node < nodes) {
      ranks[*node].push_back(rank);
    }
  }
  return ranks;
}

bool consecutive(const std::vector<int32_t>& ranks) {
  return ranks.empty() || ranks.back() - ranks.front() + 1 == static_cast<int32_t>(ranks.size());
}

NodeResult in_rank_order(const ReadyCollective& collective, const std::vector<int32_t>& ranks,
                         std::vector<const Submission*>& local) {
  const Submission& lead = collective.first();
  if (ranks.size() != collective.ranks.size()) {
    return fmt::format("{} '{}': the rank map gives this node {} ranks, not {}",
                       ipc::collective_name(lead.collective), lead.name, ranks.size(),
                       collective.ranks.size());
  }
  local.assign(ranks.size(), nullptr);
  for (const auto& s : collective.ranks) {
    const auto at = std::find(ranks.begin(), ranks.end(), s.session->identity().rank);
    if (at == ranks.end()) {
      return fmt::format("{} '{}': rank {} is not mapped to this node",
                         ipc::collective_name(lead.collective), lead.name,
                         s.session->identity().rank);
    }
    local[static_cast<size_t>(at - ranks.begin())] = &s;
  }
  return std::nullopt;
}

std::vector<std::shared_ptr<const void>> rank_memory(const ReadyCollective& collective) {
  std::vector<std::shared_ptr<const void>> memory;
  collective.append_memory(memory);
  return memory;
}

}  // namespace node_detail
}  // namespace gradsync::daemon
