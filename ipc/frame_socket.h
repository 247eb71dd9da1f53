// Length-framed messages with attached file descriptors over a unix stream socket.
//
// Frames may arrive split across reads or several in one read; fds arrive with the first bytes
// of their frame. The reader accumulates bytes and fds and hands out whole frames. A frame
// longer than kMaxFrameBytes, or carrying more than kMaxFdsPerFrame fds, is a protocol error.
#pragma once

#include "ipc/system.h"

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gradsync::ipc {

struct Frame {
  std::vector<uint8_t> payload;
  std::vector<UniqueFd> fds;
};

class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Sends a whole frame (blocking until written). Throws SystemError on failure.
void send_frame(int socket, std::span<const uint8_t> payload, std::span<const int> fds = {});

class FrameReader {
 public:
  enum class ReadResult { kProgress, kWouldBlock, kClosed };

  // Reads what the socket has (one recvmsg). Throws ProtocolError for oversized frames or
  // too many fds, SystemError for socket errors.
  ReadResult read_some(int socket);

  // The next complete frame, if any.
  std::optional<Frame> next_frame();

 private:
  std::vector<uint8_t> bytes_;
  std::deque<UniqueFd> fds_;
};

// Blocks for one frame with a timeout (client side). Throws on timeout, close or error.
Frame receive_frame(int socket, FrameReader& reader, int timeout_ms);

}  // namespace gradsync::ipc
