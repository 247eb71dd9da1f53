// The control socket as the daemon reads it: bytes from a client, arriving in pieces of any
// size, become frames (or a protocol error), Cap'n Proto messages (or a decoding error), and
// requests the control thread admits (or refuses with a reason). What it admits is consistent:
// an identity with its ranks in range, a buffer range inside its memory.
#include "daemon/control/admission.h"
#include "daemon/links/links.h"
#include "ipc/frame_socket.h"
#include "ipc/messages.h"
#include "tests/fuzz/fuzz_target.h"

#include <kj/exception.h>

#include <sys/socket.h>
#include <unistd.h>

namespace {

using namespace gradsync;
using namespace gradsync::daemon;

constexpr uint64_t kSegmentBytes = 1 << 20;  // what a registered range must lie in

void check_identity(const ClientIdentity& who) {
  if (who.local_rank < 0 || who.local_rank >= who.local_world_size ||
      who.local_world_size > ipc::kMaxLocalRanks || who.rank < 0 || who.rank >= who.world_size ||
      who.local_world_size > who.world_size) {
    fuzz::violated("an admitted identity with ranks out of range");
  }
  if (who.job.empty() || who.job.size() > ipc::kMaxJobNameBytes) {
    fuzz::violated("an admitted job name of a bad length");
  }
  if (!who.nodes.empty() &&
      (who.nodes.size() < 2 || who.nodes.size() > kMaxNodes || who.node_rank >= who.nodes.size())) {
    fuzz::violated("an admitted node list with its node out of range");
  }
}

void admit(const ipc::Frame& frame) {
  ipc::DecodedMessage message(frame.payload);
  const auto request = message.root<ipc::wire::Request>();
  switch (request.which()) {
    case ipc::wire::Request::HELLO:
      check_identity(
          validate_hello(request.getHello(), 1, 1000, HelloRules{"127.0.0.1:9478", "auto"}));
      break;
    case ipc::wire::Request::REGISTER_BUFFER: {
      const auto r = request.getRegisterBuffer();
      validate_range(r.getBufferId(), r.getOffset(), r.getBytes(), kSegmentBytes);
      if (r.getBytes() > kSegmentBytes || r.getOffset() > kSegmentBytes - r.getBytes()) {
        fuzz::violated("an admitted range outside its memory");
      }
      break;
    }
    case ipc::wire::Request::INSPECT:
      if (request.getInspect().isTrace()) {
        const auto trace = request.getInspect().getTrace();
        [[maybe_unused]] const std::string job = trace.getJob().cStr();
      }
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte cuts the rest into pieces (0: one piece), each one write and one read.
  if (size < 1) return 0;
  const size_t piece = data[0] == 0 ? size : size_t{data[0]} * 37;
  int sockets[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) return 0;
  const ipc::UniqueFd client(sockets[0]);
  const ipc::UniqueFd daemon(sockets[1]);
  ipc::FrameReader reader;
  try {
    for (size_t at = 1; at < size; at += piece) {
      const size_t n = std::min(piece, size - at);
      if (::write(client.get(), data + at, n) != static_cast<ssize_t>(n)) return 0;
      reader.read_some(daemon.get());
      while (auto frame = reader.next_frame()) {
        try {
          admit(*frame);
        } catch (const Refusal&) {
        } catch (const kj::Exception&) {
        }
      }
    }
  } catch (const ipc::ProtocolError&) {
    // The daemon hangs up on a client whose framing is broken.
  }
  return 0;
}

namespace gradsync::fuzz {

std::vector<std::vector<uint8_t>> seeds() {
  auto framed = [](capnp::MallocMessageBuilder& message) {
    const std::vector<uint8_t> payload = ipc::encode(message);
    const auto length = static_cast<uint32_t>(payload.size());
    std::vector<uint8_t> bytes(reinterpret_cast<const uint8_t*>(&length),
                               reinterpret_cast<const uint8_t*>(&length) + 4);
    bytes.insert(bytes.end(), payload.begin(), payload.end());
    return bytes;
  };
  capnp::MallocMessageBuilder hello;
  auto h = hello.initRoot<ipc::wire::Request>().initHello();
  h.setProtocolVersion(ipc::kProtocolVersion);
  h.setJob("train");
  h.setRank(3);
  h.setWorldSize(4);
  h.setLocalRank(1);
  h.setLocalWorldSize(2);
  auto nodes = h.initNodes(2);
  nodes.set(0, "127.0.0.1:9478");
  nodes.set(1, "127.0.0.1:9479");
  h.setNodeRank(-1);
  capnp::MallocMessageBuilder registration;
  auto r = registration.initRoot<ipc::wire::Request>().initRegisterBuffer();
  r.setBufferId(1);
  r.setOffset(4096);
  r.setBytes(65536);
  capnp::MallocMessageBuilder trace;
  auto t = trace.initRoot<ipc::wire::Request>().initInspect().initTrace();
  t.setJob("train");
  t.setSteps(3);
  std::vector<uint8_t> conversation = {0};  // one piece
  for (auto* message : {&hello, &registration, &trace}) {
    const auto bytes = framed(*message);
    conversation.insert(conversation.end(), bytes.begin(), bytes.end());
  }
  std::vector<uint8_t> split = conversation;
  split[0] = 3;  // 111-byte pieces: frames split across reads
  return {conversation, split};
}

}  // namespace gradsync::fuzz
