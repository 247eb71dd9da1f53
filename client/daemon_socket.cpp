#include "client/daemon_socket.h"

#include "client/communicator.h"
#include "ipc/frame_socket.h"
#include "ipc/messages.h"
#include "ipc/protocol.capnp.h"

#include <capnp/message.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

namespace gradsync::client {

ipc::UniqueFd connect_to_daemon(const std::string& path) {
  ipc::UniqueFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket.valid()) throw Error(GRADSYNC_ERR_CONNECT, std::string("socket: ") + strerror(errno));
  struct sockaddr_un address {};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "socket path is empty or too long");
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  if (::connect(socket.get(), reinterpret_cast<struct sockaddr*>(&address), sizeof(address)) != 0) {
    throw Error(GRADSYNC_ERR_CONNECT,
                "cannot connect to gradsyncd at " + path + ": " + strerror(errno));
  }
  return socket;
}

namespace {

// Asks the daemon at `path` one question (`ask` fills the Inspect) on a connection of its own,
// and hands the reply to `answer`; the daemon's error is thrown.
template <typename Ask, typename Answer>
auto inspect(const std::string& path, int timeout_ms, Ask&& ask, Answer&& answer) {
  const ipc::UniqueFd socket = connect_to_daemon(path);
  capnp::MallocMessageBuilder message;
  ask(message.initRoot<ipc::wire::Request>().initInspect());
  ipc::send_frame(socket.get(), ipc::encode(message));
  ipc::FrameReader reader;
  const ipc::Frame frame = ipc::receive_frame(socket.get(), reader, timeout_ms);
  ipc::DecodedMessage reply(frame.payload);
  const auto root = reply.root<ipc::wire::Reply>();
  if (root.isError()) {
    throw Error(static_cast<gradsync_result>(root.getError().getCode()),
                root.getError().getMessage().cStr());
  }
  return answer(root);
}

}  // namespace

std::string ask_node_address(const std::string& path, int timeout_ms) {
  return inspect(
      path, timeout_ms, [](ipc::wire::Inspect::Builder ask) { ask.setNodeAddress(); },
      [](ipc::wire::Reply::Reader reply) -> std::string {
        if (!reply.isNodeAddress()) {
          throw Error(GRADSYNC_ERR_PROTOCOL, "unexpected reply to a node-address question");
        }
        return reply.getNodeAddress().cStr();
      });
}

std::string ask_waiting_for(const std::string& path, const std::string& job, int timeout_ms) {
  return inspect(
      path, timeout_ms, [&job](ipc::wire::Inspect::Builder ask) { ask.setWaitingFor(job); },
      [](ipc::wire::Reply::Reader reply) -> std::string {
        if (!reply.isWaitingFor()) {
          throw Error(GRADSYNC_ERR_PROTOCOL, "unexpected reply to a waiting-for question");
        }
        return reply.getWaitingFor().cStr();
      });
}

}  // namespace gradsync::client
