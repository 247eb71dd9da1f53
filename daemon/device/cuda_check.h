// Checked CUDA runtime calls (CUDA builds only): a failure throws DeviceError naming the call,
// where it was made, and the driver's reason, e.g.
//   "cuda_devices.cpp:88: cudaIpcOpenMemHandle(...): invalid argument (cudaErrorInvalidValue)".
#pragma once

#include "daemon/device/devices.h"

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

namespace gradsync::daemon {

[[noreturn]] void throw_cuda_error(cudaError_t status, std::string_view call, std::string_view file,
                                   int line);

inline void cuda_check(cudaError_t status, std::string_view call, std::string_view file, int line) {
  if (status != cudaSuccess) throw_cuda_error(status, call, file, line);
}

#define GRADSYNC_CUDA_CHECK(call) ::gradsync::daemon::cuda_check((call), #call, __FILE__, __LINE__)

// The driver's entry point `symbol` with CUDA 12's ABI, through the runtime (the daemon links no
// libcuda); false where the driver lacks it.
template <typename Function>
bool driver_entry_point(const char* symbol, Function& function) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &entry, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || entry == nullptr) {
    (void)cudaGetLastError();  // the runtime keeps the last error: clear it
    return false;
  }
  function = reinterpret_cast<Function>(entry);
  return true;
}

// Makes `device` current on this thread for the scope, and restores the one before: the
// daemon's threads never find their current device changed under them.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace gradsync::daemon
