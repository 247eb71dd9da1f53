// Allgather on one node. The work line is the receive layout: K slots of `count` elements,
// slot j coming from rank j's send range and going to every rank's receive range.
#include "daemon/collectives/local/local_work.h"

#include <algorithm>

#include "kernels/reduce.h"

namespace gradsync::daemon {

LocalWork local_allgather(const ReadyCollective& collective) {
  const Submission& lead = collective.first();
  const size_t element = ipc::dtype_bytes(lead.dtype);
  const uint64_t count = lead.count;
  return LocalWork{count * collective.ranks.size(), element,
                   [&collective, element, count](uint64_t begin, uint64_t end) {
                     const auto& ranks = collective.ranks;
                     for (uint64_t at = begin; at < end;) {
                       const uint64_t slot = at / count;
                       const uint64_t within = at % count;
                       const uint64_t n = std::min(end - at, count - within);
                       const uint8_t* source = ranks[slot].send + within * element;
                       for (const auto& rank : ranks) {
                         uint8_t* target = rank.recv + at * element;
                         if (target != source)
                           std::memcpy(target, source, n * element);  // in place: skip
                       }
                       at += n;
                     }
                   }};
}

}  // namespace gradsync::daemon
