#include "ipc/messages.h"

#include "ipc/frame_socket.h"
#include "ipc/protocol.h"

#include <cstring>

namespace gradsync::ipc {

std::vector<uint8_t> encode(capnp::MessageBuilder& message) {
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  const auto bytes = words.asBytes();
  return {bytes.begin(), bytes.end()};
}

DecodedMessage::DecodedMessage(std::span<const uint8_t> payload, uint64_t traversal_limit_words) {
  if (payload.empty() || payload.size() % sizeof(capnp::word) != 0) {
    throw ProtocolError("control message of " + std::to_string(payload.size()) +
                        " bytes is not a whole number of 8-byte words");
  }
  words_ = kj::heapArray<capnp::word>(payload.size() / sizeof(capnp::word));
  std::memcpy(words_.begin(), payload.data(), payload.size());
  capnp::ReaderOptions options;
  options.traversalLimitInWords = traversal_limit_words;
  options.nestingLimit = 16;
  reader_ = std::make_unique<capnp::FlatArrayMessageReader>(
      kj::ArrayPtr<const capnp::word>(words_.begin(), words_.size()), options);
}

}  // namespace gradsync::ipc
