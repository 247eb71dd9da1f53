// Which node each rank of a job is on, as the nodes say when they join: a broadcast's chain
// starts at its root's node (node_chain_broadcast.cpp). A launcher that gives two ranks one
// RANK, or WORLD_SIZE more ranks than the nodes have, is found here, before any collective
// runs with the wrong ranks (an allgather's blocks, an average's divisor).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gradsync::daemon {

class RankMap {
 public:
  RankMap(uint32_t nodes, int32_t world_size);

  // `node`'s ranks, as it says when it joins; a node says once.
  void add(uint32_t node, std::span<const int32_t> ranks);
  // Once every node was added: what is wrong with the job's ranks, in words (a rank on two
  // nodes, outside WORLD_SIZE, or on none), if anything.
  std::optional<std::string> problem() const;
  // The node `rank` is on; nullopt for a rank outside WORLD_SIZE or on no node.
  std::optional<uint32_t> node_of(int32_t rank) const;

 private:
  static constexpr uint32_t kNowhere = UINT32_MAX;
  int32_t world_size_;
  std::vector<uint32_t> node_of_;       // by rank; kNowhere until a node claims it
  std::vector<bool> added_;             // by node
  std::optional<std::string> problem_;  // the first found
};

}  // namespace gradsync::daemon
