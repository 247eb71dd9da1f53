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
