#include "daemon/collectives/node_collectives.h"

namespace gradsync::daemon::node_detail {

std::vector<std::shared_ptr<const void>> rank_memory(const ReadyCollective& collective) {
  std::vector<std::shared_ptr<const void>> memory;
  memory.reserve(collective.ranks.size() * 2);
  for (const auto& s : collective.ranks) {
    memory.push_back(s.send_buffer);
    memory.push_back(s.recv_buffer);
  }
  return memory;
}

}  // namespace gradsync::daemon::node_detail
