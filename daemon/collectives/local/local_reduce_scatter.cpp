// Reduce-scatter on one node. The work line is the send layout: K blocks of `count` elements,
// block j reduced over every rank's send range and written to rank j's receive range: K reads
// and one write of every element, no staging copy.
#include "daemon/collectives/local/local_work.h"
#include "kernels/reduce.h"

#include <algorithm>
#include <array>

namespace gradsync::daemon {

LocalWork local_reduce_scatter(const ReadyCollective& collective) {
  const Submission& lead = collective.first();
  const size_t element = ipc::dtype_bytes(lead.dtype);
  const uint64_t count = lead.count;
  const bool streaming = lead.block_bytes() >= kernels::kStreamingMinBytes;
  return LocalWork{
      count * collective.ranks.size(), element,
      [&collective, element, count, streaming](uint64_t begin, uint64_t end) {
        const auto& ranks = collective.ranks;
        const Submission& lead = ranks.front();
        std::array<const void*, ipc::kMaxLocalRanks> inputs;  // 2 KiB: not zeroed per call
        for (uint64_t at = begin; at < end;) {
          const uint64_t block = at / count;
          const uint64_t within = at % count;
          const uint64_t n = std::min(end - at, count - within);
          for (size_t r = 0; r < ranks.size(); ++r) inputs[r] = ranks[r].send + at * element;
          void* output = ranks[block].recv + within * element;
          kernels::reduce_to_all(lead.dtype, lead.op, inputs.data(), ranks.size(), &output, 1, n,
                                 streaming);
          at += n;
        }
      }};
}

}  // namespace gradsync::daemon
