// An in-process network of node endpoints, for testing what runs over a Transport without UCX:
// a message is copied from the sender's buffer into the matching receive (or held until one is
// posted) on the spot, within one thread. Tags match as UCX matches them: the bits of the
// receive's mask, the oldest matching message first, so messages under one tag between two
// endpoints arrive in the order they were sent. A node can be failed, as a dead peer daemon.
#pragma once

#include "transport/transport.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace gradsync::transport {

class InProcessNetwork {
 public:
  explicit InProcessNetwork(uint32_t nodes);
  ~InProcessNetwork();
  InProcessNetwork(const InProcessNetwork&) = delete;
  InProcessNetwork& operator=(const InProcessNetwork&) = delete;

  // Node `index`'s endpoint; the other endpoints reach it at address(index).
  Transport& node(uint32_t index);
  static std::string address(uint32_t index);  // "in-process:INDEX"
  uint32_t nodes() const { return static_cast<uint32_t>(endpoints_.size()); }

  // Every endpoint sees `node` failed, with `reason`; sends to it fail from now on.
  void fail(uint32_t node, const std::string& reason);
  // Messages sent by every endpoint so far (not operations).
  uint64_t messages_sent() const { return messages_sent_; }

 private:
  class Endpoint;
  struct Message {
    PeerId from;
    uint64_t tag;
    std::vector<uint8_t> bytes;
  };
  void deliver(PeerId to, Message message);

  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::vector<std::string> failures_;  // by node: empty while it works
  std::vector<bool> failed_;
  uint64_t messages_sent_ = 0;
};

}  // namespace gradsync::transport
