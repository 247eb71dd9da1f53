// Client memory from the CUDA VMM API (cuMemCreate: PyTorch's expandable segments), which CUDA
// IPC cannot share: each physical segment comes as a POSIX fd, is imported here, and the
// segments are mapped one after the other in an address range the daemon reserves, readable and
// writable by the owning device and its peers. CUDA builds only (cuda_devices.cpp uses it).
#pragma once

#include "daemon/device/devices.h"

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::daemon {

// The driver's VMM entry points (through cudaGetDriverEntryPointByVersion: the daemon links no
// libcuda).
struct VmmDriver {
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;

  // The entry points, or why the driver lacks one.
  static std::shared_ptr<const VmmDriver> load(std::string& why_not);
};

// Imports `fds` (each segment's mapped size in `bytes`). Throws DeviceError.
std::shared_ptr<const ImportedSegments> import_vmm_segments(std::shared_ptr<const VmmDriver> driver,
                                                            std::vector<ipc::UniqueFd> fds,
                                                            const std::vector<uint64_t>& bytes);
// The segments' total size.
uint64_t vmm_bytes(const ImportedSegments& segments);

// Maps every segment of `segments` in a range of its own, accessible from `devices` (the
// owning device first). Returns what unmaps it when the last reference goes, and where it lies.
// Throws DeviceError.
std::shared_ptr<const void> map_vmm_segments(std::shared_ptr<const ImportedSegments> segments,
                                             const std::vector<int>& devices, uint8_t** base);

}  // namespace gradsync::daemon
