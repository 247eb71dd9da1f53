// Devices in a build without CUDA: none, and a reason that says how to get them.
#include "daemon/device/devices.h"

namespace gradsync::daemon {

struct Devices::Allocations {};

Devices Devices::probe() {
  Devices devices;
  devices.summary_ = "built without CUDA (configure with -DGRADSYNC_CUDA=ON): host memory only";
  return devices;
}

bool Devices::built_with_cuda() const {
  return false;
}

std::shared_ptr<const DeviceBuffer> Devices::map(const DeviceHandle& /*handle*/) const {
  throw DeviceError("this gradsyncd serves host memory only: " + summary_);
}

}  // namespace gradsync::daemon
