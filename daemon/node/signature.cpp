#include "daemon/node/signature.h"

#include <fmt/format.h>

namespace gradsync::daemon {

std::string Signature::describe() const {
  return fmt::format("{}, count {}, {}, {}{}{}{}{}", ipc::collective_name(collective), count,
                     ipc::dtype_name(dtype), ipc::op_name(op),
                     root >= 0 ? fmt::format(", root {}", root) : "",
                     members > 1 ? fmt::format(", a group of {}", members) : "",
                     on_device ? ", on device memory" : "",
                     priority != 0 ? fmt::format(", priority {}", priority) : "");
}

}  // namespace gradsync::daemon
