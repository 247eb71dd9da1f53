#include "daemon/links/rank_map.h"

#include <fmt/format.h>

#include <algorithm>

namespace gradsync::daemon {

RankMap::RankMap(uint32_t nodes, int32_t world_size)
    : world_size_(world_size),
      node_of_(static_cast<size_t>(std::max(world_size, 0)), kNowhere),
      added_(nodes, false) {}

void RankMap::add(uint32_t node, std::span<const int32_t> ranks) {
  if (node >= added_.size() || added_[node]) return;
  added_[node] = true;
  for (const int32_t rank : ranks) {
    if (problem_) return;
    if (rank < 0 || rank >= world_size_) {
      problem_ = fmt::format("node {} has rank {}, outside WORLD_SIZE {}", node, rank, world_size_);
    } else if (const uint32_t other = node_of_[static_cast<size_t>(rank)]; other != kNowhere) {
      problem_ = other == node ? fmt::format("node {} has rank {} twice", node, rank)
                               : fmt::format("rank {} is on node {} and on node {}", rank,
                                             std::min(node, other), std::max(node, other));
    } else {
      node_of_[static_cast<size_t>(rank)] = node;
    }
  }
}

std::optional<std::string> RankMap::problem() const {
  if (problem_) return problem_;
  for (size_t rank = 0; rank < node_of_.size(); ++rank) {
    if (node_of_[rank] == kNowhere) {
      return fmt::format("rank {} is on no node: WORLD_SIZE is {}, the nodes' ranks are fewer",
                         rank, world_size_);
    }
  }
  return std::nullopt;
}

std::optional<uint32_t> RankMap::node_of(int32_t rank) const {
  if (rank < 0 || rank >= world_size_) return std::nullopt;
  const uint32_t node = node_of_[static_cast<size_t>(rank)];
  return node == kNowhere ? std::nullopt : std::optional(node);
}

}  // namespace gradsync::daemon
