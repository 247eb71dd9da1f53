// All-to-all on one node. The work line is every rank's receive range, one after the other:
// block i of rank j's receive range is block j of rank i's send range, copied straight across
// (one read and one write of every element).
#include "daemon/collectives/local/local_work.h"
#include "kernels/reduce.h"

#include <algorithm>

namespace gradsync::daemon {

LocalWork local_alltoall(const ReadyCollective& collective) {
  const Submission& lead = collective.first();
  const size_t element = ipc::dtype_bytes(lead.dtype);
  const uint64_t count = lead.count;
  const uint64_t ranks = collective.ranks.size();
  const bool streaming = lead.block_bytes() * ranks >= kernels::kStreamingMinBytes;
  return LocalWork{count * ranks * ranks, element,
                   [&collective, element, count, ranks, streaming](uint64_t begin, uint64_t end) {
                     const auto& all = collective.ranks;
                     for (uint64_t at = begin; at < end;) {
                       const uint64_t target = at / (count * ranks);
                       const uint64_t source = at / count % ranks;
                       const uint64_t within = at % count;
                       const uint64_t n = std::min(end - at, count - within);
                       kernels::copy(all[target].recv + (source * count + within) * element,
                                     all[source].send + (target * count + within) * element,
                                     n * element, streaming);
                       at += n;
                     }
                   }};
}

}  // namespace gradsync::daemon
