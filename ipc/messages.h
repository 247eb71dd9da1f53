// Cap'n Proto encoding of control messages to and from frame payloads.
#pragma once

#include "ipc/protocol.capnp.h"
#include "ipc/protocol.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace gradsync::ipc {

std::vector<uint8_t> encode(capnp::MessageBuilder& message);

// Owns an aligned copy of a payload and reads it with limits fit for untrusted input.
// Throws kj::Exception (caught at the boundary) when the payload is not a valid message.
class DecodedMessage {
 public:
  // `traversal_limit_words` bounds what reading may visit (the message's size, in effect).
  explicit DecodedMessage(std::span<const uint8_t> payload,
                          uint64_t traversal_limit_words = kTraversalLimitWords);

  template <typename Root>
  typename Root::Reader root() {
    return reader_->getRoot<Root>();
  }

 private:
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

}  // namespace gradsync::ipc
