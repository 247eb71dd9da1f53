// Allreduce on one node: K reads and K writes of every element, the memory-traffic minimum.
// The reduce writes straight into every rank's receive buffer; no staging copy.
#include "daemon/collectives/local/local_work.h"
#include "kernels/reduce.h"

#include <array>

namespace gradsync::daemon {

LocalWork local_allreduce(const ReadyCollective& collective) {
  const Submission& lead = collective.first();
  const size_t element = ipc::dtype_bytes(lead.dtype);
  const bool streaming = lead.block_bytes() >= kernels::kStreamingMinBytes;
  return LocalWork{
      lead.count, element, [&collective, streaming](uint64_t begin, uint64_t end) {
        const auto& ranks = collective.ranks;
        const Submission& lead = ranks.front();
        const size_t element = ipc::dtype_bytes(lead.dtype);
        std::array<const void*, ipc::kMaxLocalRanks> inputs;  // 2 KiB: not zeroed per call
        std::array<void*, ipc::kMaxLocalRanks> outputs;
        for (size_t r = 0; r < ranks.size(); ++r) {
          inputs[r] = ranks[r].send + begin * element;
          outputs[r] = ranks[r].recv + begin * element;
        }
        kernels::reduce_to_all(lead.dtype, lead.op, inputs.data(), ranks.size(), outputs.data(),
                               ranks.size(), end - begin, streaming);
      }};
}

LocalWork local_work_for(const ReadyCollective& collective) {
  switch (collective.first().collective) {
    case ipc::Collective::kAllreduce:
      return local_allreduce(collective);
    case ipc::Collective::kBroadcast:
      return local_broadcast(collective);
    case ipc::Collective::kAllgather:
      return local_allgather(collective);
    case ipc::Collective::kReduceScatter:
      return local_reduce_scatter(collective);
    case ipc::Collective::kAllToAll:
      return local_alltoall(collective);
    case ipc::Collective::kBarrier:
      break;
  }
  return LocalWork{};  // a barrier moves no data
}

}  // namespace gradsync::daemon
