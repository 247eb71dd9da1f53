#include "daemon/collectives/node_collectives.h"
#include "kernels/reduce.h"

#include <array>

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

void reduce_into(const ReadyCollective& collective, gradsync_op op, uint8_t* work, uint64_t begin,
                 uint64_t end, const uint8_t* extra) {
  const Submission& lead = collective.first();
  const size_t element = ipc::dtype_bytes(lead.dtype);
  std::array<const void*, ipc::kMaxLocalRanks + 1> inputs{};
  size_t n = 0;
  for (const auto& s : collective.ranks) inputs[n++] = s.send + begin * element;
  if (extra != nullptr) inputs[n++] = extra;
  void* output = work + begin * element;
  if (n == 1 && inputs[0] == output) return;  // one rank, in place: already there
  kernels::reduce_to_all(lead.dtype, op, inputs.data(), n, &output, 1, end - begin, false);
}

void copy_to_other_ranks(const ReadyCollective& collective, const uint8_t* work, uint64_t begin,
                         uint64_t end) {
  const size_t element = ipc::dtype_bytes(collective.first().dtype);
  const uint64_t bytes = (end - begin) * element;
  const bool streaming = bytes >= kernels::kStreamingMinBytes;
  for (size_t r = 1; r < collective.ranks.size(); ++r) {
    kernels::copy(collective.ranks[r].recv + begin * element, work + begin * element, bytes,
                  streaming);
  }
}

}  // namespace gradsync::daemon::node_detail
