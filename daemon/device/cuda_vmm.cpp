#include "daemon/device/cuda_vmm.h"

#include "daemon/device/cuda_check.h"

#include <fmt/format.h>

#include <cstdint>
#include <utility>

namespace gradsync::daemon {

// The imported handles; released with the last registration (and mapping) that names them.
struct ImportedSegments {
  std::shared_ptr<const VmmDriver> driver;
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<uint64_t> bytes;
  uint64_t total = 0;

  ImportedSegments() = default;
  ImportedSegments(const ImportedSegments&) = delete;
  ImportedSegments& operator=(const ImportedSegments&) = delete;
  ~ImportedSegments() {
    for (const CUmemGenericAllocationHandle handle : handles) (void)driver->release(handle);
  }
};

namespace {

[[noreturn]] void throw_driver_error(CUresult status, const char* call) {
  throw DeviceError(fmt::format("{} failed (CUresult {})", call, static_cast<int>(status)));
}

void driver_check(CUresult status, const char* call) {
  if (status != CUDA_SUCCESS) throw_driver_error(status, call);
}

// A reserved range with the segments mapped in it; unmapped and freed with the last reference.
struct MappedSegments {
  std::shared_ptr<const ImportedSegments> segments;
  CUdeviceptr base = 0;
  uint64_t mapped = 0;  // bytes mapped from base, segment by segment
  bool reserved = false;

  MappedSegments() = default;
  MappedSegments(const MappedSegments&) = delete;
  MappedSegments& operator=(const MappedSegments&) = delete;
  ~MappedSegments() {
    const VmmDriver& driver = *segments->driver;
    if (mapped > 0) (void)driver.unmap(base, mapped);
    if (reserved) (void)driver.address_free(base, segments->total);
  }
};

}  // namespace

std::shared_ptr<const VmmDriver> VmmDriver::load(std::string& why_not) {
  auto driver = std::make_shared<VmmDriver>();
  const bool loaded = driver_entry_point("cuMemImportFromShareableHandle", driver->import_handle) &&
                      driver_entry_point("cuMemRelease", driver->release) &&
                      driver_entry_point("cuMemAddressReserve", driver->reserve) &&
                      driver_entry_point("cuMemAddressFree", driver->address_free) &&
                      driver_entry_point("cuMemMap", driver->map) &&
                      driver_entry_point("cuMemUnmap", driver->unmap) &&
                      driver_entry_point("cuMemSetAccess", driver->set_access);
  if (!loaded) {
    why_not = "the CUDA driver lacks the VMM API (cuMemImportFromShareableHandle and the rest)";
    return nullptr;
  }
  return driver;
}

std::shared_ptr<const ImportedSegments> import_vmm_segments(std::shared_ptr<const VmmDriver> driver,
                                                            std::vector<ipc::UniqueFd> fds,
                                                            const std::vector<uint64_t>& bytes) {
  if (fds.empty() || fds.size() != bytes.size()) {
    throw DeviceError(
        fmt::format("{} segment sizes for {} file descriptors", bytes.size(), fds.size()));
  }
  auto segments = std::make_shared<ImportedSegments>();
  segments->driver = std::move(driver);
  for (size_t i = 0; i < fds.size(); ++i) {
    // Bounded so that the total cannot wrap: no device holds 2^48 bytes.
    if (bytes[i] == 0 || bytes[i] > (uint64_t{1} << 48)) {
      throw DeviceError(fmt::format("segment {} has {} bytes", i, bytes[i]));
    }
    CUmemGenericAllocationHandle handle = 0;
    // The driver reads the fd's number, passed in a pointer's place; it does not take the fd
    // (ours closes when `fds` goes).
    void* fd = reinterpret_cast<void*>(  // NOLINT(performance-no-int-to-ptr): see above
        static_cast<uintptr_t>(fds[i].get()));
    driver_check(
        segments->driver->import_handle(&handle, fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle (is the fd one that cuMemExportToShareableHandle "
        "made?)");
    segments->handles.push_back(handle);
    segments->bytes.push_back(bytes[i]);
    segments->total += bytes[i];
  }
  return segments;
}

uint64_t vmm_bytes(const ImportedSegments& segments) {
  return segments.total;
}

std::shared_ptr<const void> map_vmm_segments(std::shared_ptr<const ImportedSegments> segments,
                                             const std::vector<int>& devices, uint8_t** base) {
  const VmmDriver& driver = *segments->driver;
  const DeviceScope scope(devices.front());
  GRADSYNC_CUDA_CHECK(cudaFree(nullptr));  // the device's context exists from here on
  auto mapped = std::make_shared<MappedSegments>();
  mapped->segments = std::move(segments);
  const ImportedSegments& imported = *mapped->segments;
  driver_check(driver.reserve(&mapped->base, imported.total, 0, 0, 0), "cuMemAddressReserve");
  mapped->reserved = true;
  for (size_t i = 0; i < imported.handles.size(); ++i) {
    driver_check(
        driver.map(mapped->base + mapped->mapped, imported.bytes[i], 0, imported.handles[i], 0),
        "cuMemMap (a segment size that is not the client's mapping?)");
    mapped->mapped += imported.bytes[i];
  }
  std::vector<CUmemAccessDesc> access(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) {
    access[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[d].location.id = devices[d];
    access[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  driver_check(driver.set_access(mapped->base, imported.total, access.data(), access.size()),
               "cuMemSetAccess");
  // The reserved range's address, as a pointer of this process (the bits are the same).
  *base = reinterpret_cast<uint8_t*>(mapped->base);  // NOLINT(performance-no-int-to-ptr)
  return mapped;
}

}  // namespace gradsync::daemon
