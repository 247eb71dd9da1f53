// Broadcast on one node: one read of the root's data per receiver, one write each.
#include "daemon/collectives/local/local_work.h"

#include "kernels/reduce.h"

namespace gradsync::daemon {

LocalWork local_broadcast(const ReadyCollective& collective) {
  const Submission& lead = collective.first();
  const size_t element = ipc::dtype_bytes(lead.dtype);
  const bool streaming = lead.block_bytes() >= kernels::kStreamingMinBytes;
  return LocalWork{lead.count, element, [&collective, streaming](uint64_t begin, uint64_t end) {
                     const auto& ranks = collective.ranks;
                     const size_t element = ipc::dtype_bytes(ranks.front().dtype);
                     const uint8_t* source =
                         ranks[static_cast<size_t>(ranks.front().root)].send + begin * element;
                     const size_t bytes = (end - begin) * element;
                     for (const auto& rank : ranks) {
                       uint8_t* target = rank.recv + begin * element;
                       if (target != source) kernels::copy(target, source, bytes, streaming);
                     }
                   }};
}

}  // namespace gradsync::daemon
