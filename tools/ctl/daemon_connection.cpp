#include "tools/ctl/daemon_connection.h"

#include "ipc/frame_socket.h"
#include "ipc/messages.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <kj/exception.h>

#include <cerrno>
#include <cstring>

namespace gradsync::ctl {

// Reports above this are not believed (a full trace is a few hundred MiB at most).
constexpr uint64_t kMaxReportBytes = 1ull << 30;

DaemonConnection::DaemonConnection(const std::string& socket_path)
    : socket_path_(socket_path), socket_(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
  if (!socket_.valid()) throw CtlError(kExitUnreachable, std::strerror(errno));
  struct sockaddr_un address {};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(address.sun_path)) {
    throw CtlError(kExitUsage, "socket path too long: " + socket_path);
  }
  std::memcpy(address.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(socket_.get(), reinterpret_cast<struct sockaddr*>(&address), sizeof(address)) !=
      0) {
    throw CtlError(kExitUnreachable,
                   "cannot reach gradsyncd at " + socket_path + ": " + std::strerror(errno));
  }
}

std::string DaemonConnection::ask(capnp::MallocMessageBuilder& request,
                                  std::chrono::milliseconds timeout) {
  ipc::Frame frame;
  try {
    ipc::send_frame(socket_.get(), ipc::encode(request));
    ipc::FrameReader reader;
    frame = ipc::receive_frame(socket_.get(), reader, static_cast<int>(timeout.count()));
  } catch (const std::exception& e) {
    throw CtlError(kExitUnreachable, "gradsyncd at " + socket_path_ + ": " + e.what());
  }
  try {
    ipc::DecodedMessage message(frame.payload);
    const auto reply = message.root<ipc::wire::Reply>();
    if (reply.isError()) {
      throw CtlError(kExitRefused, reply.getError().getMessage().cStr());
    }
    if (!reply.isReport() || frame.fds.size() != 1) {
      throw CtlError(kExitUnreachable, "gradsyncd sent an unexpected reply");
    }
    const uint64_t bytes = reply.getReport().getBytes();
    if (bytes > kMaxReportBytes || bytes > ipc::sealed_memfd_size(frame.fds[0].get())) {
      throw CtlError(kExitUnreachable, "gradsyncd sent a report of an impossible size");
    }
    std::string text(bytes, '\0');
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n =
          ::pread(frame.fds[0].get(), text.data() + done, bytes - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw CtlError(kExitUnreachable, "cannot read gradsyncd's report");
      done += static_cast<size_t>(n);
    }
    return text;
  } catch (const kj::Exception& e) {
    throw CtlError(kExitUnreachable,
                   std::string("malformed reply from gradsyncd: ") + e.getDescription().cStr());
  } catch (const ipc::SystemError& e) {
    throw CtlError(kExitUnreachable, std::string("gradsyncd's report: ") + e.what());
  }
}

}  // namespace gradsync::ctl
