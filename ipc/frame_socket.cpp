#include "ipc/frame_socket.h"

#include "ipc/protocol.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace gradsync::ipc {
namespace {

constexpr size_t kLengthBytes = sizeof(uint32_t);

}  // namespace

void send_frame(int socket, std::span<const uint8_t> payload, std::span<const int> fds) {
  if (payload.size() > kMaxFrameBytes) throw ProtocolError("frame too large to send");
  if (fds.size() > static_cast<size_t>(kMaxFdsPerFrame)) throw ProtocolError("too many fds");
  const auto length = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> wire(kLengthBytes + payload.size());
  std::memcpy(wire.data(), &length, kLengthBytes);
  std::memcpy(wire.data() + kLengthBytes, payload.data(), payload.size());

  size_t sent = 0;
  bool fds_sent = fds.empty();
  while (sent < wire.size()) {
    struct iovec iov {
      wire.data() + sent, wire.size() - sent
    };
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)] = {};
    if (!fds_sent) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = ::sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pfd {
          socket, POLLOUT, 0
        };
        ::poll(&pfd, 1, 1000);
        continue;
      }
      throw SystemError("sendmsg", errno);
    }
    fds_sent = true;
    sent += static_cast<size_t>(n);
  }
}

FrameReader::ReadResult FrameReader::read_some(int socket) {
  uint8_t buffer[16384];
  struct iovec iov {
    buffer, sizeof(buffer)
  };
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame * 2)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(socket, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return ReadResult::kWouldBlock;
    if (errno == ECONNRESET) return ReadResult::kClosed;
    throw SystemError("recvmsg", errno);
  }
  // Take ownership of every fd first, so none leaks when we reject the frame below.
  for (struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr;
       cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
      const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
        fds_.emplace_back(fd);
      }
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0)
    throw ProtocolError("too many file descriptors in a frame");
  if (fds_.size() > static_cast<size_t>(kMaxFdsPerFrame) * 2) {
    throw ProtocolError("too many file descriptors pending");
  }
  if (n == 0) return ReadResult::kClosed;
  bytes_.insert(bytes_.end(), buffer, buffer + n);
  if (bytes_.size() >= kLengthBytes) {
    uint32_t length = 0;
    std::memcpy(&length, bytes_.data(), kLengthBytes);
    if (length > kMaxFrameBytes) {
      throw ProtocolError("frame of " + std::to_string(length) + " bytes exceeds the limit of " +
                          std::to_string(kMaxFrameBytes));
    }
  }
  return ReadResult::kProgress;
}

std::optional<Frame> FrameReader::next_frame() {
  if (bytes_.size() < kLengthBytes) return std::nullopt;
  uint32_t length = 0;
  std::memcpy(&length, bytes_.data(), kLengthBytes);
  if (length > kMaxFrameBytes) throw ProtocolError("frame exceeds the size limit");
  if (bytes_.size() < kLengthBytes + length) return std::nullopt;
  Frame frame;
  frame.payload.assign(bytes_.begin() + kLengthBytes, bytes_.begin() + kLengthBytes + length);
  bytes_.erase(bytes_.begin(), bytes_.begin() + kLengthBytes + length);
  // A frame owns every fd received so far: fds travel with the first bytes of their frame, and
  // the sender sends one frame at a time.
  while (!fds_.empty()) {
    frame.fds.push_back(std::move(fds_.front()));
    fds_.pop_front();
  }
  return frame;
}

Frame receive_frame(int socket, FrameReader& reader, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    if (auto frame = reader.next_frame()) return std::move(*frame);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw SystemError("waiting for the daemon's reply", ETIMEDOUT);
    struct pollfd pfd {
      socket, POLLIN, 0
    };
    const int rc = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno != EINTR) throw SystemError("poll", errno);
    if (rc <= 0) continue;
    if (reader.read_some(socket) == FrameReader::ReadResult::kClosed) {
      throw SystemError("the daemon closed the connection", ECONNRESET);
    }
  }
}

}  // namespace gradsync::ipc
