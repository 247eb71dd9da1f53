// The CUDA driver calls libgradsync makes to describe device memory for the daemon, loaded
// from libcuda.so.1 on first use: the library links no CUDA, and a process without a driver
// gets a clear error instead of a failure to load.
#pragma once

#include "ipc/system.h"

#include <gradsync/gradsync.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace gradsync::client {

// Device memory as the daemon opens it: through the CUDA IPC handle of the allocation it lies
// in (cudaMalloc), or, for memory from the VMM API (cuMemCreate: PyTorch's expandable
// segments), which CUDA IPC cannot share, through a POSIX fd per physical segment it spans.
struct DeviceMemory {
  // The range's offset (from the allocation's base, or the first segment's) and the device's
  // UUID always; the IPC handle for IPC memory.
  gradsync_cuda_ipc_memory description{};
  std::vector<ipc::UniqueFd> segment_fds;  // VMM memory: one per segment, in address order
  std::vector<uint64_t> segment_bytes;     // each one's mapped size
  // The driver's buffer id at the start of each allocation or segment the range covers (where
  // the range starts, in the first): checked at each submission, since memory freed and
  // allocated again at the same address would leave the daemon's mapping on the old memory.
  std::vector<std::pair<const uint8_t*, uint64_t>> allocation_ids;
  // Whether this process's context on the device is shared through NVIDIA MPS (unknown where
  // the driver cannot tell, or the handle came from elsewhere).
  std::optional<bool> shared_via_mps;

  bool vmm() const { return !segment_fds.empty(); }
};

// Describes [ptr, ptr + bytes) of device memory. Throws Error: no driver
// (GRADSYNC_ERR_UNSUPPORTED), not device memory, past the allocation's end or the mapped
// segments', or memory that can be shared neither way (GRADSYNC_ERR_INVALID_ARGUMENT).
DeviceMemory describe_device_memory(const void* ptr, size_t bytes);

// The driver's process-wide unique id of the allocation holding `ptr` (an address freed and
// allocated again gets a new one). Throws Error like describe_device_memory.
uint64_t device_allocation_id(const void* ptr);

using IpcEventHandle = std::array<uint8_t, 64>;

// The events of collectives ordered on a CUDA stream, one pair per slot: this process's ready
// event, recorded on its stream after the data is written (the daemon's stream waits for it),
// and the daemon's completion event, which the stream waits for in turn. A slot is busy from
// the submission until its completion is read: neither side records an event the other has
// not finished waiting on.
class StreamEvents {
 public:
  static constexpr uint32_t kSlots = 64;

  // Makes the ready events on the current context's device. Throws Error.
  StreamEvents();
  ~StreamEvents();
  StreamEvents(const StreamEvents&) = delete;
  StreamEvents& operator=(const StreamEvents&) = delete;

  std::vector<IpcEventHandle> ready_handles() const;
  const std::array<uint8_t, 16>& device_uuid() const { return device_uuid_; }
  // The daemon's completion events, one per slot. Throws Error.
  void open_completions(const std::vector<IpcEventHandle>& handles);

  std::optional<uint32_t> acquire();
  void release(uint32_t slot) { busy_[slot] = false; }
  // Throw Error (with the driver's reason).
  void record_ready(uint32_t slot, void* stream);
  void wait_completion(uint32_t slot, void* stream);

 private:
  std::vector<void*> ready_;        // CUevent
  std::vector<void*> completions_;  // CUevent, opened from the daemon's handles
  std::vector<bool> busy_;
  std::array<uint8_t, 16> device_uuid_{};
};

}  // namespace gradsync::client
