#include "daemon/control/unix_listener.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace gradsync::daemon {
namespace {

struct sockaddr_un unix_address(const std::string& path) {
  struct sockaddr_un address {};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), std::min(path.size(), sizeof(address.sun_path) - 1));
  return address;
}

}  // namespace

// The socket is bound, given its mode and group and put into listening state under a
// temporary name, then renamed into place: whoever sees the path can connect at once.
ipc::UniqueFd bind_listener(const DaemonConfig& config) {
  const std::string& path = config.socket_path;
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ignored);
  const struct sockaddr_un final_address = unix_address(path);
  ipc::UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (::connect(probe.get(), reinterpret_cast<const struct sockaddr*>(&final_address),
                sizeof(final_address)) == 0) {
    throw std::runtime_error("another gradsyncd is serving " + path);
  }
  const std::string staging = path + ".new";
  if (staging.size() >= sizeof(final_address.sun_path)) {
    throw std::runtime_error("socket path too long: " + path);
  }
  ::unlink(staging.c_str());
  ipc::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) throw ipc::SystemError("socket", errno);
  const struct sockaddr_un staging_address = unix_address(staging);
  if (::bind(fd.get(), reinterpret_cast<const struct sockaddr*>(&staging_address),
             sizeof(staging_address)) != 0) {
    throw ipc::SystemError("bind " + staging, errno);
  }
  auto undo = [&staging](const std::string& what, int error) {
    ::unlink(staging.c_str());
    return ipc::SystemError(what, error);
  };
  if (::chmod(staging.c_str(), config.socket_mode) != 0) throw undo("chmod " + staging, errno);
  if (!config.socket_group.empty()) {
    const struct group* group = ::getgrnam(config.socket_group.c_str());
    if (group == nullptr) throw undo("unknown socket_group " + config.socket_group, ENOENT);
    if (::chown(staging.c_str(), static_cast<uid_t>(-1), group->gr_gid) != 0) {
      throw undo("chown " + staging, errno);
    }
  }
  if (::listen(fd.get(), 128) != 0) throw undo("listen", errno);
  if (::rename(staging.c_str(), path.c_str()) != 0) throw undo("rename to " + path, errno);
  return fd;
}

}  // namespace gradsync::daemon
