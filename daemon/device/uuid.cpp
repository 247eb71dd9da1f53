#include "daemon/device/devices.h"

#include <fmt/format.h>

namespace gradsync::daemon {

std::string format_uuid(const DeviceUuid& uuid) {
  std::string text = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += fmt::format("{:02x}", uuid[i]);
  }
  return text;
}

}  // namespace gradsync::daemon
