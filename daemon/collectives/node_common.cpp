#include "daemon/collectives/node_collectives.h"

namespace gradsync::daemon::node_detail {

std::vector<std::shared_ptr<const void>> rank_memory(const ReadyCollective& collective) {
  std::vector<std::shared_ptr<const void>> memory;
  collective.append_memory(memory);
  return memory;
}

}  // namespace gradsync::daemon::node_detail
