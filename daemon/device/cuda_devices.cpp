// Devices through the CUDA runtime (linked statically: the daemon starts, and serves host
// memory, on machines without a driver). Driver entry points the runtime does not wrap come
// through cudaGetDriverEntryPointByVersion, never by linking libcuda.
#include "daemon/device/cuda_check.h"
#include "daemon/device/cuda_vmm.h"
#include "daemon/device/devices.h"

#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

namespace gradsync::daemon {

void throw_cuda_error(cudaError_t status, std::string_view call, std::string_view file, int line) {
  const size_t slash = file.rfind('/');
  if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
  throw DeviceError(fmt::format("{}:{}: {}: {} ({})", file, line, call, cudaGetErrorString(status),
                                cudaGetErrorName(status)));
}

DeviceScope::DeviceScope(int device) {
  GRADSYNC_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    GRADSYNC_CUDA_CHECK(cudaSetDevice(device));
    restore_ = true;
  }
}

DeviceScope::~DeviceScope() {
  if (restore_) (void)cudaSetDevice(previous_);  // it was current a moment ago: cannot fail
}

namespace {

using GetAddressRange = CUresult (*)(CUdeviceptr* base, size_t* bytes, CUdeviceptr pointer);

// One client allocation opened in the daemon; closed when the last piece mapped from it goes.
struct OpenAllocation {
  int device = 0;
  void* base = nullptr;
  size_t bytes = 0;
  OpenAllocation(int device_ordinal, void* opened) : device(device_ordinal), base(opened) {}
  OpenAllocation(const OpenAllocation&) = delete;
  OpenAllocation& operator=(const OpenAllocation&) = delete;
  ~OpenAllocation() {
    try {
      const DeviceScope scope(device);
      // A failure here leaves an opened mapping behind and nothing to retry it with.
      (void)cudaIpcCloseMemHandle(base);
    } catch (const DeviceError&) {  // the device is gone; so is the mapping
    }
  }
};

}  // namespace

struct Devices::Allocations {
  GetAddressRange get_address_range = nullptr;
  std::shared_ptr<const VmmDriver> vmm;  // null: the driver has no VMM API (why: vmm_missing)
  std::string vmm_missing;
  std::mutex mutex;
  std::map<IpcHandleBytes, std::weak_ptr<const OpenAllocation>> open;
};

Devices Devices::probe() {
  Devices devices;
  int count = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // the runtime keeps the last error: clear it
    devices.summary_ =
        fmt::format("CUDA built in, no usable device (cudaGetDeviceCount: {}): host memory only",
                    status != cudaSuccess ? cudaGetErrorString(status) : "the driver reports none");
    return devices;
  }
  auto allocations = std::make_shared<Allocations>();
  if (!driver_entry_point("cuMemGetAddressRange", allocations->get_address_range)) {
    devices.summary_ =
        "CUDA built in, but the driver lacks cuMemGetAddressRange (needs CUDA 12 or later): "
        "host memory only";
    return devices;
  }
  allocations->vmm = VmmDriver::load(allocations->vmm_missing);

  std::string listed;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    cudaDeviceProp properties{};
    GRADSYNC_CUDA_CHECK(cudaGetDeviceProperties(&properties, ordinal));
    DeviceInfo info;
    info.ordinal = ordinal;
    info.name = properties.name;
    std::memcpy(info.uuid.data(), properties.uuid.bytes, info.uuid.size());
    char bus_id[32] = {};
    GRADSYNC_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), ordinal));
    info.pci_bus_id = bus_id;
    int mps = 0;
    if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, ordinal) != cudaSuccess) {
      (void)cudaGetLastError();  // a driver that predates the attribute: no MPS to speak of
      mps = 0;
    }
    info.shared_via_mps = mps != 0;
    listed +=
        fmt::format("{}{}: {} ({}, {}{})", listed.empty() ? "" : "; ", ordinal, info.name,
                    format_uuid(info.uuid), info.pci_bus_id, info.shared_via_mps ? ", MPS" : "");
    devices.devices_.push_back(std::move(info));
  }
  devices.summary_ = fmt::format("CUDA, {} device{}: {}", count, count == 1 ? "" : "s", listed);
  devices.allocations_ = std::move(allocations);
  return devices;
}

bool Devices::built_with_cuda() const {
  return true;
}

std::shared_ptr<const DeviceBuffer> Devices::map(const DeviceHandle& handle) const {
  if (!available()) throw DeviceError("this gradsyncd serves host memory only: " + summary_);
  const auto device = std::find_if(devices_.begin(), devices_.end(),
                                   [&](const DeviceInfo& d) { return d.uuid == handle.device; });
  if (device == devices_.end()) {
    throw DeviceError(fmt::format("device {} is not one of this node's: {}",
                                  format_uuid(handle.device), summary_));
  }

  if (handle.segments) return map_segments(handle, device->ordinal);

  std::shared_ptr<const OpenAllocation> allocation;
  {
    const std::lock_guard lock(allocations_->mutex);
    std::erase_if(allocations_->open, [](const auto& entry) { return entry.second.expired(); });
    if (auto it = allocations_->open.find(handle.ipc); it != allocations_->open.end()) {
      allocation = it->second.lock();
    }
    if (!allocation) {
      const DeviceScope scope(device->ordinal);
      cudaIpcMemHandle_t ipc{};
      static_assert(sizeof(ipc.reserved) == kIpcHandleBytes);
      std::memcpy(ipc.reserved, handle.ipc.data(), kIpcHandleBytes);
      void* base = nullptr;
      GRADSYNC_CUDA_CHECK(cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess));
      auto opened = std::make_shared<OpenAllocation>(device->ordinal, base);
      CUdeviceptr range_base = 0;
      size_t range_bytes = 0;
      if (const CUresult status = allocations_->get_address_range(
              &range_base, &range_bytes, reinterpret_cast<CUdeviceptr>(base));
          status != CUDA_SUCCESS) {
        throw DeviceError(fmt::format("cuMemGetAddressRange of an opened IPC handle failed ({})",
                                      static_cast<int>(status)));
      }
      opened->bytes = range_bytes;
      allocations_->open[handle.ipc] = opened;
      allocation = std::move(opened);
    }
  }
  // The client names the range; a range past the allocation would let one client's bad input
  // fault the daemon's GPU context, and with it every other client's work.
  if (handle.offset > allocation->bytes || handle.bytes > allocation->bytes - handle.offset) {
    throw DeviceError(fmt::format("range [{}, {}) lies outside its allocation of {} bytes",
                                  handle.offset, handle.offset + handle.bytes, allocation->bytes));
  }
  auto buffer = std::make_shared<DeviceBuffer>();
  buffer->data = static_cast<uint8_t*>(allocation->base) + handle.offset;
  buffer->bytes = handle.bytes;
  buffer->device = allocation->device;
  buffer->allocation = std::move(allocation);
  return buffer;
}

std::shared_ptr<const ImportedSegments> Devices::import_segments(
    std::vector<ipc::UniqueFd> fds, const std::vector<uint64_t>& bytes) const {
  if (!available()) throw DeviceError("this gradsyncd serves host memory only: " + summary_);
  if (!allocations_->vmm) throw DeviceError(allocations_->vmm_missing);
  // The driver imports into the thread's current context: a device's primary one.
  const DeviceScope scope(devices_.front().ordinal);
  GRADSYNC_CUDA_CHECK(cudaFree(nullptr));
  return import_vmm_segments(allocations_->vmm, std::move(fds), bytes);
}

std::shared_ptr<const DeviceBuffer> Devices::map_segments(const DeviceHandle& handle,
                                                          int ordinal) const {
  // The client names the range, as for IPC memory: it must lie within the segments.
  const uint64_t total = vmm_bytes(*handle.segments);
  if (handle.offset > total || handle.bytes > total - handle.offset) {
    throw DeviceError(fmt::format("range [{}, {}) lies outside its {} bytes of segments",
                                  handle.offset, handle.offset + handle.bytes, total));
  }
  // The owning device, then every peer that can reach it: a node's GPUs each reduce a share,
  // reading the others' memory.
  std::vector<int> access{ordinal};
  for (const DeviceInfo& peer : devices_) {
    int can = 0;
    if (peer.ordinal != ordinal &&
        cudaDeviceCanAccessPeer(&can, peer.ordinal, ordinal) == cudaSuccess && can != 0) {
      access.push_back(peer.ordinal);
    }
  }
  uint8_t* base = nullptr;
  auto buffer = std::make_shared<DeviceBuffer>();
  buffer->allocation = map_vmm_segments(handle.segments, access, &base);
  buffer->data = base + handle.offset;
  buffer->bytes = handle.bytes;
  buffer->device = ordinal;
  return buffer;
}

}  // namespace gradsync::daemon
