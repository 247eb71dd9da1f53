// Host shared memory for the mapping cache (mapping_cache.h): a client's sealed memfd and the
// range of it the client registered.
#pragma once

#include "ipc/system.h"

#include <sys/types.h>

#include <cstdint>
#include <memory>

namespace gradsync::daemon {

// A registered host buffer: the daemon's mapping of exactly the range the client registered.
struct HostBuffer {
  ipc::Mapping mapping;  // page-aligned superset of the range
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

// Maps the pages of [offset, offset + bytes) of `fd`, and nothing else. Throws
// ipc::SystemError.
std::shared_ptr<const HostBuffer> map_host_range(int fd, uint64_t offset, uint64_t bytes);

struct HostHandle {
  std::shared_ptr<const ipc::UniqueFd> memfd;  // kept open: an evicted range maps again
  uint64_t offset = 0;
  uint64_t bytes = 0;
  dev_t device = 0;  // the memfd's identity: another memfd is other memory, whatever its fd
  ino_t inode = 0;
};

// The handle of a range of a memfd the daemon holds (it keeps the fd, shared by the handles of
// every range of that memfd). Throws ipc::SystemError.
HostHandle host_handle(std::shared_ptr<const ipc::UniqueFd> memfd, uint64_t offset, uint64_t bytes);
inline HostHandle host_handle(ipc::UniqueFd memfd, uint64_t offset, uint64_t bytes) {
  return host_handle(std::make_shared<const ipc::UniqueFd>(std::move(memfd)), offset, bytes);
}

class HostMapper {
 public:
  using Handle = HostHandle;
  using Mapping = HostBuffer;
  std::shared_ptr<const HostBuffer> map(const HostHandle& handle) const {
    return map_host_range(handle.memfd->get(), handle.offset, handle.bytes);
  }
  static bool same(const HostHandle& a, const HostHandle& b) {
    return a.device == b.device && a.inode == b.inode && a.offset == b.offset && a.bytes == b.bytes;
  }
};

}  // namespace gradsync::daemon
