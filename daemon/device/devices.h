// The node's GPUs as the daemon sees them, and the daemon's mappings of its clients' device
// memory (CUDA IPC). One interface, two builds: cuda_devices.cpp where CUDA is built in,
// no_cuda_devices.cpp where it is not; the rest of the daemon has no #ifdef.
//
// CUDA built in but no device or driver is a normal state: the daemon serves host memory, says
// so in its log, build info and status, and refuses device registrations with that reason.
#pragma once

#include "ipc/system.h"

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradsync::daemon {

using DeviceUuid = std::array<uint8_t, 16>;
inline constexpr size_t kIpcHandleBytes = 64;  // cudaIpcMemHandle_t, CUipcMemHandle
using IpcHandleBytes = std::array<uint8_t, kIpcHandleBytes>;

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
std::string format_uuid(const DeviceUuid& uuid);

// The physical segments of a client's memory from the CUDA VMM API (cuMemCreate), imported from
// the POSIX fds it sent: held while a registration names them, so that a mapping the cache
// evicted maps again. Released with the last reference.
struct ImportedSegments;

// What a client registers: the IPC handle of the allocation its memory lies in (allocators
// hand out pieces of larger blocks), or for VMM memory its imported segments, the piece's
// offset and size within it (within the segments, mapped one after the other), and the device.
struct DeviceHandle {
  IpcHandleBytes ipc{};                              // CUDA IPC; zero for VMM memory
  std::shared_ptr<const ImportedSegments> segments;  // VMM memory; null for CUDA IPC
  uint64_t offset = 0;
  uint64_t bytes = 0;
  DeviceUuid device{};
};

// The daemon's view of a registered piece of device memory. Holds its allocation open: every
// piece of one allocation shares one mapping (CUDA maps a handle at most once per process).
struct DeviceBuffer {
  uint8_t* data = nullptr;  // device pointer in the daemon's address space
  uint64_t bytes = 0;
  int device = 0;  // ordinal in the daemon's process
  std::shared_ptr<const void> allocation;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  DeviceUuid uuid{};
  std::string pci_bus_id;
  // Contexts made on it are shared through NVIDIA MPS. Without MPS the GPU time-slices between
  // this daemon's context and each rank's: work alternating between them pays a switch.
  bool shared_via_mps = false;
};

// A CUDA call that failed, with where and why.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Devices {
 public:
  // Looks for devices; never throws for their absence. Cheap when there are none.
  static Devices probe();

  bool built_with_cuda() const;
  // Whether device registrations are served: CUDA built in and at least one device usable.
  bool available() const { return !devices_.empty(); }
  const std::vector<DeviceInfo>& devices() const { return devices_; }
  // One line for the log, build info and gradsyncctl: the devices, or why there are none.
  const std::string& summary() const { return summary_; }

  // Maps `handle` (opening its allocation, or sharing the open one), checking that the piece
  // lies inside the allocation. Thread-safe. Throws DeviceError naming what is wrong (unknown
  // device, a handle the driver rejects, a range past the allocation's end); without devices,
  // the reason there are none.
  std::shared_ptr<const DeviceBuffer> map(const DeviceHandle& handle) const;

  // Imports a client's VMM segments: one POSIX fd each (closed here), with each one's mapped
  // size, in address order. Thread-safe. Throws DeviceError naming what is wrong (an fd the
  // driver does not take, a size of 0); without devices, the reason there are none.
  std::shared_ptr<const ImportedSegments> import_segments(std::vector<ipc::UniqueFd> fds,
                                                          const std::vector<uint64_t>& bytes) const;

 private:
  // Maps a handle's VMM segments on device `ordinal` (CUDA build).
  std::shared_ptr<const DeviceBuffer> map_segments(const DeviceHandle& handle, int ordinal) const;

  struct Allocations;  // open IPC allocations by handle, in the CUDA build
  std::vector<DeviceInfo> devices_;
  std::string summary_;
  std::shared_ptr<Allocations> allocations_;
};

// The mapping cache's mapper for device memory (see mapping_cache.h).
class DeviceMapper {
 public:
  using Handle = DeviceHandle;
  using Mapping = DeviceBuffer;
  explicit DeviceMapper(Devices devices) : devices_(std::move(devices)) {}
  std::shared_ptr<const DeviceBuffer> map(const DeviceHandle& handle) const {
    return devices_.map(handle);
  }
  // Handles are compared byte for byte: memory freed and allocated again, even at the same
  // address, comes with another handle (VMM memory with other fds, imported anew).
  static bool same(const DeviceHandle& a, const DeviceHandle& b) {
    return a.ipc == b.ipc && a.segments == b.segments && a.offset == b.offset &&
           a.bytes == b.bytes && a.device == b.device;
  }
  const Devices& devices() const { return devices_; }

 private:
  Devices devices_;
};

}  // namespace gradsync::daemon
