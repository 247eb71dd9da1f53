// The CUDA driver calls libgradsync makes to describe device memory for the daemon, loaded
// from libcuda.so.1 on first use: the library links no CUDA, and a process without a driver
// gets a clear error instead of a failure to load.
#pragma once

#include <gradsync/gradsync.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace gradsync::client {

// The allocation holding [ptr, ptr + bytes) of device memory, its IPC handle, the range's
// offset in it and the device's UUID. Throws Error: no driver (GRADSYNC_ERR_UNSUPPORTED), not
// device memory, past the allocation's end, or memory CUDA IPC cannot share
// (GRADSYNC_ERR_INVALID_ARGUMENT).
gradsync_cuda_ipc_memory describe_device_memory(const void* ptr, size_t bytes);

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
