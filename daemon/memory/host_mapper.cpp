#include "daemon/memory/host_mapper.h"

#include <sys/stat.h>

#include <cerrno>

namespace gradsync::daemon {

std::shared_ptr<const HostBuffer> map_host_range(int fd, uint64_t offset, uint64_t bytes) {
  // Exactly the pages of the range: the daemon cannot touch anything else of the client's.
  const uint64_t page = ipc::page_size();
  const uint64_t map_offset = offset & ~(page - 1);
  const uint64_t map_bytes = (offset + bytes - map_offset + page - 1) & ~(page - 1);
  auto buffer = std::make_shared<HostBuffer>();
  buffer->mapping = ipc::Mapping(fd, map_offset, map_bytes);
  buffer->data = static_cast<uint8_t*>(buffer->mapping.data()) + (offset - map_offset);
  buffer->bytes = bytes;
  return buffer;
}

HostHandle host_handle(std::shared_ptr<const ipc::UniqueFd> memfd, uint64_t offset,
                       uint64_t bytes) {
  struct stat status {};
  if (::fstat(memfd->get(), &status) != 0) throw ipc::SystemError("fstat(memfd)", errno);
  return HostHandle{std::move(memfd), offset, bytes, status.st_dev, status.st_ino};
}

}  // namespace gradsync::daemon
