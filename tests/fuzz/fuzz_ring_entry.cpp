// The ring-entry validation, the boundary for everything a client writes on its submission
// ring: any 256 bytes (with the rank and rank count that come before them) resolve to an error
// or to ranges that lie inside the buffers they name: the daemon never reads or writes outside
// what a client registered.
#include "daemon/job/submission.h"
#include "tests/fuzz/fuzz_target.h"

#include <array>
#include <cstring>

namespace {

using namespace gradsync;

// Registered buffers 0-3, of different sizes, in memory of our own.
constexpr std::array<uint64_t, 4> kSizes = {0, 1, 4096, 1 << 20};
std::array<std::vector<uint8_t>, kSizes.size()> g_memory;

std::shared_ptr<const daemon::HostBuffer> lookup(uint32_t id) {
  if (id >= kSizes.size()) return nullptr;
  auto buffer = std::make_shared<daemon::HostBuffer>();
  g_memory[id].resize(kSizes[id] + 1);
  buffer->data = g_memory[id].data();
  buffer->bytes = kSizes[id];
  return buffer;
}

bool inside(const uint8_t* begin, uint64_t bytes, const daemon::HostBuffer& buffer) {
  return begin >= buffer.data && bytes <= buffer.bytes &&
         static_cast<uint64_t>(begin - buffer.data) <= buffer.bytes - bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Layout: rank (1 byte), ranks (1 byte), then the entry.
  if (size < 2) return 0;
  const int32_t ranks = 1 + data[1] % 8;
  const int32_t rank = data[0] % ranks;
  ipc::SubmissionEntry entry{};
  std::memcpy(&entry, data + 2, std::min(size - 2, sizeof(entry)));
  const daemon::Submission s = daemon::resolve_submission(entry, lookup, rank, ranks);
  if (!s.valid() || s.collective == ipc::Collective::kBarrier) return 0;
  if (!s.send_buffer || !s.recv_buffer) fuzz::violated("a valid submission without its buffers");
  // The lookup above hands out host buffers only: the mappings are HostBuffers.
  if (!inside(s.send, s.send_bytes(ranks),
              *static_cast<const daemon::HostBuffer*>(s.send_buffer.get()))) {
    fuzz::violated("the send range leaves its buffer");
  }
  if (!inside(s.recv, s.recv_bytes(ranks),
              *static_cast<const daemon::HostBuffer*>(s.recv_buffer.get()))) {
    fuzz::violated("the receive range leaves its buffer");
  }
  return 0;
}

namespace gradsync::fuzz {

std::vector<std::vector<uint8_t>> seeds() {
  auto seed = [](uint8_t rank, uint8_t ranks, ipc::Collective collective, uint64_t count,
                 uint64_t send_offset, uint64_t recv_offset) {
    ipc::SubmissionEntry entry{};
    entry.request = 7;
    entry.collective = static_cast<uint8_t>(collective);
    entry.dtype = GRADSYNC_FLOAT32;
    entry.op = GRADSYNC_SUM;
    entry.send_buffer = 3;
    entry.recv_buffer = 3;
    entry.send_offset = send_offset;
    entry.recv_offset = recv_offset;
    entry.count = count;
    std::memcpy(entry.name, "grad.0", 6);
    entry.name_length = 6;
    std::vector<uint8_t> bytes = {rank, ranks};
    const auto* raw = reinterpret_cast<const uint8_t*>(&entry);
    bytes.insert(bytes.end(), raw, raw + sizeof(entry));
    return bytes;
  };
  return {seed(0, 1, ipc::Collective::kAllreduce, 1024, 0, 0),
          seed(1, 3, ipc::Collective::kAllgather, 256, 1024, 0),
          seed(0, 1, ipc::Collective::kBroadcast, 100, 0, 4096),
          seed(0, 1, ipc::Collective::kAllreduce, (1 << 18), 4, 4)};  // one element too far
}

}  // namespace gradsync::fuzz
