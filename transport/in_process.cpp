#include "transport/in_process.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace gradsync::transport {

class InProcessNetwork::Endpoint final : public Transport {
 public:
  Endpoint(InProcessNetwork& network, PeerId me) : network_(network), me_(me) {}

  PeerId connect(const std::string& address) override {
    const std::string prefix = "in-process:";
    if (address.rfind(prefix, 0) != 0) {
      throw std::invalid_argument("no in-process node at '" + address + "'");
    }
    const auto peer = static_cast<PeerId>(std::stoul(address.substr(prefix.size())));
    if (peer >= network_.nodes()) throw std::invalid_argument("no node " + address);
    return peer;
  }
  bool authenticated(PeerId peer) const override { return !failed(peer); }
  bool failed(PeerId peer) const override { return network_.failed_.at(peer); }
  const std::string& failure(PeerId peer) const override { return network_.failures_.at(peer); }
  void check_alive(PeerId /*peer*/) override {}

  Operation send(PeerId peer, uint64_t tag, const void* data, size_t bytes,
                 size_t /*max_message_bytes*/, Lane /*lane*/ = Lane::kBulk) override {
    // Cut into messages or not, what one send delivers to one receive is the same here; and
    // every message arrives as it is sent, so both lanes keep order.
    auto state = std::make_unique<Operation::State>();
    state->done = true;
    if (failed(peer) || failed(me_)) {
      state->status = UCS_ERR_NOT_CONNECTED;
    } else {
      const auto* from = static_cast<const uint8_t*>(data);
      network_.deliver(peer, Message{me_, tag, std::vector<uint8_t>(from, from + bytes)});
    }
    return Operation::without_requests(std::move(state), false);
  }

  Operation receive(uint64_t tag, uint64_t tag_mask, void* data, size_t bytes,
                    std::optional<PeerId> from, size_t /*max_message_bytes*/) override {
    auto state = std::make_unique<Operation::State>();
    state->source = from.value_or(Operation::kAnySource);
    Posted posted{tag, tag_mask, static_cast<uint8_t*>(data), bytes, state.get()};
    const auto match = std::find_if(arrived_.begin(), arrived_.end(),
                                    [&](const Message& m) { return posted.matches(m); });
    if (match != arrived_.end()) {
      posted.complete(*match);
      arrived_.erase(match);
    } else {
      posted_.push_back(posted);
    }
    return Operation::without_requests(std::move(state), true);
  }

  void post(PeerId peer, uint64_t tag, std::shared_ptr<const std::vector<uint8_t>> bytes,
            Lane /*lane*/ = Lane::kBulk) override {
    if (!failed(peer) && !failed(me_)) network_.deliver(peer, Message{me_, tag, *bytes});
  }

  void retire(std::vector<Operation> operations,
              std::vector<std::shared_ptr<const void>> /*memory*/) override {
    // Sends are done at once; a pending receive is cancelled here and now, so nothing will
    // write its memory any more.
    for (const Operation& operation : operations) {
      std::erase_if(posted_, [&](const Posted& p) { return p.state == operation.state(); });
    }
  }

  bool progress() override { return false; }  // everything moved as it was sent
  void count_received(PeerId /*peer*/, uint64_t /*bytes*/) override {}
  void set_link(PeerId /*peer*/, double /*latency*/, double /*bandwidth*/) override {}

  // A message for this endpoint: into the oldest matching receive, or held for one.
  void arrive(Message message) {
    const auto match = std::find_if(posted_.begin(), posted_.end(),
                                    [&](const Posted& p) { return p.matches(message); });
    if (match == posted_.end()) {
      arrived_.push_back(std::move(message));
      return;
    }
    match->complete(message);
    posted_.erase(match);
  }

 private:
  struct Posted {
    uint64_t tag;
    uint64_t mask;
    uint8_t* data;
    size_t bytes;
    Operation::State* state;

    bool matches(const Message& m) const {
      return (m.tag & mask) == (tag & mask) &&
             (state->source == Operation::kAnySource || state->source == m.from);
    }
    void complete(const Message& m) const {
      const size_t fits = std::min(bytes, m.bytes.size());
      if (fits > 0) std::memcpy(data, m.bytes.data(), fits);
      state->received = fits;
      state->sender_tag = m.tag;
      state->status = m.bytes.size() > bytes ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
      state->done = true;
    }
  };

  InProcessNetwork& network_;
  PeerId me_;
  std::deque<Message> arrived_;  // not received yet, oldest first
  std::vector<Posted> posted_;   // receives not matched yet, oldest first
};

InProcessNetwork::InProcessNetwork(uint32_t nodes) : failures_(nodes), failed_(nodes, false) {
  for (uint32_t node = 0; node < nodes; ++node) {
    endpoints_.push_back(std::make_unique<Endpoint>(*this, node));
  }
}

InProcessNetwork::~InProcessNetwork() = default;

Transport& InProcessNetwork::node(uint32_t index) {
  return *endpoints_.at(index);
}

std::string InProcessNetwork::address(uint32_t index) {
  return "in-process:" + std::to_string(index);
}

void InProcessNetwork::fail(uint32_t node, const std::string& reason) {
  failed_.at(node) = true;
  failures_.at(node) = reason;
}

void InProcessNetwork::deliver(PeerId to, Message message) {
  ++messages_sent_;
  endpoints_.at(to)->arrive(std::move(message));
}

}  // namespace gradsync::transport
