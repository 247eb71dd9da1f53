#include "client/cuda_driver.h"

#include "client/communicator.h"
#include "ipc/protocol.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#if __has_include(<cuda.h>)
#include <cuda.h>
#define GRADSYNC_HAVE_CUDA_H 1
#endif

namespace gradsync::client {
namespace {

// The driver's ABI, as much of it as is used here. Checked against cuda.h where the build
// has it.
using DriverResult = int;                        // CUresult; 0 is success
using DevicePointer = unsigned long long;        // NOLINT(google-runtime-int): CUdeviceptr
constexpr int kAttributeMemoryType = 2;          // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttributeDeviceOrdinal = 9;       // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kAttributeBufferId = 7;            // CU_POINTER_ATTRIBUTE_BUFFER_ID
constexpr unsigned kMemoryTypeDevice = 2;        // CU_MEMORYTYPE_DEVICE
using Event = void*;                             // CUevent
using Stream = void*;                            // CUstream, cudaStream_t
constexpr unsigned kEventDisableTiming = 0x2;    // CU_EVENT_DISABLE_TIMING
constexpr unsigned kEventInterprocess = 0x4;     // CU_EVENT_INTERPROCESS
using AllocationHandle = unsigned long long;     // NOLINT(google-runtime-int): VMM's handle
constexpr int kHandleTypePosixFd = 1;            // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int kDeviceAttributeMpsEnabled = 133;  // CU_DEVICE_ATTRIBUTE_MPS_ENABLED
struct IpcHandle {
  char reserved[64];
};
struct Uuid {
  char bytes[16];
};
#ifdef GRADSYNC_HAVE_CUDA_H
static_assert(CU_POINTER_ATTRIBUTE_MEMORY_TYPE == kAttributeMemoryType);
static_assert(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == kAttributeDeviceOrdinal);
static_assert(CU_POINTER_ATTRIBUTE_BUFFER_ID == kAttributeBufferId);
static_assert(CU_DEVICE_ATTRIBUTE_MPS_ENABLED == kDeviceAttributeMpsEnabled);
static_assert(CU_MEMORYTYPE_DEVICE == kMemoryTypeDevice);
static_assert(sizeof(CUipcMemHandle) == sizeof(IpcHandle) && sizeof(CUuuid) == sizeof(Uuid));
static_assert(sizeof(CUdeviceptr) == sizeof(DevicePointer));
static_assert(CU_EVENT_DISABLE_TIMING == kEventDisableTiming);
static_assert(CU_EVENT_INTERPROCESS == kEventInterprocess);
static_assert(sizeof(CUipcEventHandle) == sizeof(IpcHandle) && sizeof(CUevent) == sizeof(Event));
static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(AllocationHandle));
static_assert(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == kHandleTypePosixFd);
#endif

struct Driver {
  void* library = nullptr;
  std::string error;  // why it could not be loaded
  DriverResult (*init)(unsigned flags) = nullptr;
  DriverResult (*get_error_string)(DriverResult, const char**) = nullptr;
  DriverResult (*pointer_attribute)(void* data, int attribute, DevicePointer pointer) = nullptr;
  DriverResult (*address_range)(DevicePointer* base, size_t* bytes,
                                DevicePointer pointer) = nullptr;
  DriverResult (*ipc_handle)(IpcHandle* handle, DevicePointer pointer) = nullptr;
  DriverResult (*device_get)(int* device, int ordinal) = nullptr;
  DriverResult (*device_uuid)(Uuid* uuid, int device) = nullptr;
  DriverResult (*device_attribute)(int* value, int attribute, int device) = nullptr;
  DriverResult (*context_device)(int* device) = nullptr;
  DriverResult (*event_create)(Event* event, unsigned flags) = nullptr;
  DriverResult (*event_destroy)(Event event) = nullptr;
  DriverResult (*event_record)(Event event, Stream stream) = nullptr;
  DriverResult (*event_ipc_handle)(IpcHandle* handle, Event event) = nullptr;
  DriverResult (*event_open)(Event* event, IpcHandle handle) = nullptr;
  DriverResult (*stream_wait)(Stream stream, Event event, unsigned flags) = nullptr;
  DriverResult (*event_query)(Event event) = nullptr;
  // The VMM API: null where the driver has none (VMM memory cannot exist there either).
  DriverResult (*retain_allocation)(AllocationHandle* handle, void* address) = nullptr;
  DriverResult (*release_allocation)(AllocationHandle handle) = nullptr;
  DriverResult (*export_allocation)(void* shareable, AllocationHandle handle, int type,
                                    unsigned long long flags) = nullptr;  // NOLINT

  std::string describe(DriverResult result) const {
    const char* text = nullptr;
    if (get_error_string != nullptr && get_error_string(result, &text) == 0 && text != nullptr) {
      return text;
    }
    return "CUDA error " + std::to_string(result);
  }
};

template <typename Function>
bool load(void* library, const char* symbol, Function& function) {
  function = reinterpret_cast<Function>(::dlsym(library, symbol));
  return function != nullptr;
}

Driver open_driver() {
  Driver driver;
  driver.library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver.library == nullptr) {
    const char* why = ::dlerror();
    driver.error =
        std::string("no CUDA driver in this process (") + (why ? why : "libcuda.so.1") + ")";
    return driver;
  }
  void* lib = driver.library;
  const bool loaded = load(lib, "cuInit", driver.init) &&
                      load(lib, "cuGetErrorString", driver.get_error_string) &&
                      load(lib, "cuPointerGetAttribute", driver.pointer_attribute) &&
                      load(lib, "cuMemGetAddressRange_v2", driver.address_range) &&
                      load(lib, "cuIpcGetMemHandle", driver.ipc_handle) &&
                      load(lib, "cuDeviceGet", driver.device_get) &&
                      (load(lib, "cuDeviceGetUuid_v2", driver.device_uuid) ||
                       load(lib, "cuDeviceGetUuid", driver.device_uuid)) &&
                      load(lib, "cuDeviceGetAttribute", driver.device_attribute) &&
                      load(lib, "cuCtxGetDevice", driver.context_device) &&
                      load(lib, "cuEventCreate", driver.event_create) &&
                      load(lib, "cuEventDestroy_v2", driver.event_destroy) &&
                      load(lib, "cuEventRecord", driver.event_record) &&
                      load(lib, "cuIpcGetEventHandle", driver.event_ipc_handle) &&
                      load(lib, "cuIpcOpenEventHandle", driver.event_open) &&
                      load(lib, "cuStreamWaitEvent", driver.stream_wait) &&
                      load(lib, "cuEventQuery", driver.event_query);
  if (!(load(lib, "cuMemRetainAllocationHandle", driver.retain_allocation) &&
        load(lib, "cuMemRelease", driver.release_allocation) &&
        load(lib, "cuMemExportToShareableHandle", driver.export_allocation))) {
    driver.retain_allocation = nullptr;
  }
  if (!loaded) {
    driver.error = "the CUDA driver lacks an entry point gradsync needs (driver too old?)";
  } else if (const DriverResult result = driver.init(0); result != 0) {
    driver.error = "cuInit failed: " + driver.describe(result);
  }
  return driver;
}

// Loaded once per process and never changed after (the library stays loaded: PyTorch's
// driver is the same one).
const Driver& driver() {
  static const Driver loaded = open_driver();
  return loaded;
}

void check(const Driver& d, DriverResult result, const char* call,
           const char* what = "register device memory") {
  if (result != 0) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                std::string(what) + ": " + call + ": " + d.describe(result));
  }
}

const Driver& loaded_driver(const char* what) {
  const Driver& d = driver();
  if (!d.error.empty()) throw Error(GRADSYNC_ERR_UNSUPPORTED, std::string(what) + ": " + d.error);
  return d;
}

// The driver's device addresses are integers with the bits of the process's pointers.
void* as_pointer(DevicePointer address) {
  return reinterpret_cast<void*>(address);  // NOLINT(performance-no-int-to-ptr): see above
}

// Whether `pointer` lies in memory mapped through the VMM API.
bool is_vmm(const Driver& d, DevicePointer pointer) {
  if (d.retain_allocation == nullptr) return false;
  AllocationHandle handle = 0;
  if (d.retain_allocation(&handle, as_pointer(pointer)) != 0) return false;
  (void)d.release_allocation(handle);
  return true;
}

// The driver's buffer id at `address`, or 0 where it has none to give.
uint64_t buffer_id_or_0(const Driver& d, const uint8_t* address) {
  unsigned long long id = 0;  // NOLINT(google-runtime-int): the attribute's type
  const auto pointer = static_cast<DevicePointer>(reinterpret_cast<uintptr_t>(address));
  return d.pointer_attribute(&id, kAttributeBufferId, pointer) == 0 ? id : 0;
}

// VMM memory: cuMemGetAddressRange names only the physical segment holding a pointer, so the
// segments the range spans are walked one mapping at a time, each exported as a POSIX fd.
void describe_segments(const Driver& d, DevicePointer pointer, size_t bytes, DevicePointer base,
                       size_t segment_bytes, DeviceMemory& memory) {
  const DevicePointer end = pointer + bytes;
  DevicePointer at = base;
  while (true) {
    if (memory.segment_fds.size() == static_cast<size_t>(ipc::kMaxFdsPerFrame)) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                  "register device memory: the range spans more than " +
                      std::to_string(ipc::kMaxFdsPerFrame) +
                      " physical segments: register it in smaller pieces");
    }
    AllocationHandle handle = 0;
    check(d, d.retain_allocation(&handle, as_pointer(at)), "cuMemRetainAllocationHandle");
    int fd = -1;
    const DriverResult exported = d.export_allocation(&fd, handle, kHandleTypePosixFd, 0);
    (void)d.release_allocation(handle);
    if (exported != 0) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                  "register device memory: this cuMemCreate allocation cannot be shared "
                  "(cuMemExportToShareableHandle: " +
                      d.describe(exported) +
                      "); it must be made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in its "
                      "requested handle types");
    }
    memory.segment_fds.emplace_back(fd);
    memory.segment_bytes.push_back(segment_bytes);
    const auto* start = static_cast<const uint8_t*>(as_pointer(std::max(at, pointer)));
    memory.allocation_ids.emplace_back(start, buffer_id_or_0(d, start));
    if (end <= at + segment_bytes) return;
    at += segment_bytes;
    DevicePointer next = 0;
    if (d.address_range(&next, &segment_bytes, at) != 0 || next != at) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                  "register device memory: the range runs past the memory mapped there (" +
                      std::to_string(at - pointer) + " bytes are mapped from the pointer)");
    }
  }
}

}  // namespace

DeviceMemory describe_device_memory(const void* ptr, size_t bytes) {
  const Driver& d = loaded_driver("register device memory");
  const auto pointer = static_cast<DevicePointer>(reinterpret_cast<uintptr_t>(ptr));
  unsigned memory_type = 0;
  if (d.pointer_attribute(&memory_type, kAttributeMemoryType, pointer) != 0 ||
      memory_type != kMemoryTypeDevice) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "register device memory: the pointer is not CUDA device memory");
  }
  int ordinal = 0;
  check(d, d.pointer_attribute(&ordinal, kAttributeDeviceOrdinal, pointer),
        "cuPointerGetAttribute");
  DevicePointer base = 0;
  size_t allocation_bytes = 0;
  check(d, d.address_range(&base, &allocation_bytes, pointer), "cuMemGetAddressRange");
  int device = 0;
  check(d, d.device_get(&device, ordinal), "cuDeviceGet");
  Uuid uuid{};
  check(d, d.device_uuid(&uuid, device), "cuDeviceGetUuid");

  DeviceMemory memory;
  // A driver that predates the attribute cannot tell: left unknown.
  if (int mps = 0; d.device_attribute(&mps, kDeviceAttributeMpsEnabled, device) == 0) {
    memory.shared_via_mps = mps != 0;
  }
  memory.description.offset = pointer - base;
  std::memcpy(memory.description.device_uuid, uuid.bytes, sizeof(memory.description.device_uuid));
  if (is_vmm(d, pointer)) {
    describe_segments(d, pointer, bytes, base, allocation_bytes, memory);
    return memory;
  }
  const uint64_t offset = memory.description.offset;
  if (bytes > allocation_bytes - offset) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "register device memory: the range runs past the end of its allocation (" +
                    std::to_string(allocation_bytes - offset) + " bytes left from the pointer)");
  }
  IpcHandle handle{};
  if (const DriverResult result = d.ipc_handle(&handle, base); result != 0) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "register device memory: CUDA IPC cannot share this allocation "
                "(cuIpcGetMemHandle: " +
                    d.describe(result) + ")");
  }
  std::memcpy(memory.description.handle, handle.reserved, sizeof(memory.description.handle));
  memory.allocation_ids.emplace_back(static_cast<const uint8_t*>(ptr), device_allocation_id(ptr));
  return memory;
}

uint64_t device_allocation_id(const void* ptr) {
  const Driver& d = loaded_driver("device memory");
  unsigned long long id = 0;  // NOLINT(google-runtime-int): the attribute's type
  check(d,
        d.pointer_attribute(&id, kAttributeBufferId,
                            static_cast<DevicePointer>(reinterpret_cast<uintptr_t>(ptr))),
        "cuPointerGetAttribute(BUFFER_ID)", "device memory");
  return id;
}

constexpr const char* kEventsCall = "order on a CUDA stream";

StreamEvents::StreamEvents() : busy_(kSlots, false) {
  const Driver& d = loaded_driver(kEventsCall);
  int device = 0;
  check(d, d.context_device(&device), "cuCtxGetDevice (is a device current on this thread?)",
        kEventsCall);
  Uuid uuid{};
  check(d, d.device_uuid(&uuid, device), "cuDeviceGetUuid", kEventsCall);
  std::memcpy(device_uuid_.data(), uuid.bytes, device_uuid_.size());
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    Event event = nullptr;
    if (const DriverResult result =
            d.event_create(&event, kEventDisableTiming | kEventInterprocess);
        result != 0) {
      for (Event made : ready_) (void)d.event_destroy(made);  // no destructor runs for us
      check(d, result, "cuEventCreate", kEventsCall);
    }
    ready_.push_back(event);
  }
}

StreamEvents::~StreamEvents() {
  const Driver& d = driver();
  if (!d.error.empty()) return;
  for (Event event : ready_) (void)d.event_destroy(event);
  for (Event event : completions_) (void)d.event_destroy(event);
}

std::vector<IpcEventHandle> StreamEvents::ready_handles() const {
  const Driver& d = loaded_driver(kEventsCall);
  std::vector<IpcEventHandle> handles;
  for (Event event : ready_) {
    IpcHandle handle{};
    check(d, d.event_ipc_handle(&handle, event), "cuIpcGetEventHandle", kEventsCall);
    IpcEventHandle bytes{};
    std::memcpy(bytes.data(), handle.reserved, bytes.size());
    handles.push_back(bytes);
  }
  return handles;
}

void StreamEvents::open_completions(const std::vector<IpcEventHandle>& handles) {
  const Driver& d = loaded_driver(kEventsCall);
  if (handles.size() != ready_.size()) {
    throw Error(GRADSYNC_ERR_PROTOCOL, "gradsyncd answered " + std::to_string(handles.size()) +
                                           " completion events for " +
                                           std::to_string(ready_.size()) + " slots");
  }
  for (const IpcEventHandle& bytes : handles) {
    IpcHandle handle{};
    std::memcpy(handle.reserved, bytes.data(), bytes.size());
    Event event = nullptr;
    check(d, d.event_open(&event, handle), "cuIpcOpenEventHandle", kEventsCall);
    completions_.push_back(event);
  }
}

std::optional<uint32_t> StreamEvents::acquire() {
  for (uint32_t slot = 0; slot < busy_.size(); ++slot) {
    if (!busy_[slot]) {
      busy_[slot] = true;
      return slot;
    }
  }
  return std::nullopt;
}

void StreamEvents::record_ready(uint32_t slot, void* stream) {
  const Driver& d = loaded_driver(kEventsCall);
  check(d, d.event_record(ready_.at(slot), stream), "cuEventRecord", kEventsCall);
}

void StreamEvents::wait_completion(uint32_t slot, void* stream) {
  const Driver& d = loaded_driver(kEventsCall);
  // The daemon answers once its work is done, so the event usually is: the stream then has
  // nothing to wait for. A stream's wait on another process's event, even one done, costs a
  // switch between the processes' contexts where the GPU is not shared through MPS (about
  // 0.15 ms on an H200; 6 µs under MPS: BENCHMARKS.md, GPU). Not done, or a query that fails:
  // the wait, which reports a real failure.
  if (d.event_query(completions_.at(slot)) == 0) return;
  check(d, d.stream_wait(stream, completions_.at(slot), 0), "cuStreamWaitEvent", kEventsCall);
}

}  // namespace gradsync::client
