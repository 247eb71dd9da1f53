// Messages from another node daemon, as node 0 of a two-node job reads them: any sequence of
// frames either decodes and passes the negotiator's checks, or is refused with an error (which
// fails the job). Whatever the peer sends, node 0 decides only what it proposed itself, each
// once: the decisions' cookies index the node's own table of ready collectives.
#include "daemon/node/negotiator.h"
#include "ipc/messages.h"
#include "tests/fuzz/fuzz_target.h"

#include <kj/exception.h>

#include <cstring>
#include <set>

namespace {

using namespace gradsync;
using namespace gradsync::daemon;

constexpr uint32_t kProposals = 6;  // 3 names, 2 steps
constexpr uint32_t kEagerBytes = 64;

Proposal proposal(uint32_t i) {
  Proposal p;
  p.key = "grad." + std::to_string(i % 3);
  p.signature.collective = ipc::Collective::kAllreduce;
  p.signature.count = i % 3 == 0 ? kEagerBytes / 4 : 1 << 20;
  if (i % 3 == 0) p.eager.assign(kEagerBytes, static_cast<uint8_t>(i));
  p.cookie = i;
  return p;
}

std::unique_ptr<Negotiator> make_node(uint32_t me, Negotiator::SendFn send) {
  auto node = std::make_unique<Negotiator>("job", 2, me, "ranks " + std::to_string(me), 16,
                                           LinkFigures{1e-5, 1e-9, 1e-10}, std::move(send));
  for (uint32_t i = 0; i < kProposals; ++i) node->propose(proposal(i), i + 1 < kProposals);
  return node;
}

// Frames: a 4-byte length, then that many bytes of a Cap'n Proto message.
template <typename Fn>
void for_each_frame(const uint8_t* data, size_t size, Fn&& fn) {
  while (size >= 4) {
    uint32_t length = 0;
    std::memcpy(&length, data, 4);
    data += 4;
    size -= 4;
    if (length > size) length = static_cast<uint32_t>(size);
    fn(std::span<const uint8_t>(data, length));
    data += length;
    size -= length;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto node0 = make_node(0, [](uint32_t, capnp::MessageBuilder&) {});
  std::set<uint64_t> decided;
  bool failed = false;
  for_each_frame(data, size, [&](std::span<const uint8_t> frame) {
    if (failed) return;  // the first refusal fails the job: nothing after it is read
    try {
      ipc::DecodedMessage decoded(frame, kNodeMessageLimitWords);
      const auto message = decoded.root<wire::NodeMessage>();
      if (message.getNode() != 1) {  // NodeJob's check: another node of the job
        failed = true;
        return;
      }
      if (message.isCycle()) node0->on_cycle(1, message.getCycle());
      if (message.isResponse()) node0->on_response(1, message.getResponse());
    } catch (const std::exception&) {  // as the engine: a refusal, or a frame that is no message
      failed = true;
    } catch (const kj::Exception&) {
      failed = true;
    }
    for (const CycleDecisions& cycle : node0->decided()) {
      for (const Decision& decision : cycle.decisions) {
        if (decision.cookie >= kProposals) fuzz::violated("a decision for nothing proposed");
        if (!decided.insert(decision.cookie).second) fuzz::violated("a proposal decided twice");
        const auto contributions = cycle.contributions_of(decision);
        if (!contributions.empty() && contributions.size() != 2) {
          fuzz::violated("contributions of a decision are not one per node");
        }
      }
    }
    node0->decided().clear();
  });
  return 0;
}

namespace gradsync::fuzz {

// What node 1 sends node 0 in a real exchange: both propose the same collectives, and the
// messages go back and forth until neither has more to say.
std::vector<std::vector<uint8_t>> seeds() {
  std::vector<std::vector<uint8_t>> to_node0;
  std::vector<std::vector<uint8_t>> to_node1;
  auto node0 =
      make_node(0, [&](uint32_t, capnp::MessageBuilder& m) { to_node1.push_back(ipc::encode(m)); });
  auto node1 =
      make_node(1, [&](uint32_t, capnp::MessageBuilder& m) { to_node0.push_back(ipc::encode(m)); });
  std::vector<uint8_t> conversation;  // node 1's messages to node 0, framed
  for (size_t read0 = 0, read1 = 0; read0 < to_node0.size() || read1 < to_node1.size();) {
    while (read1 < to_node1.size()) {
      ipc::DecodedMessage decoded(to_node1[read1++], kNodeMessageLimitWords);
      const auto message = decoded.root<wire::NodeMessage>();
      if (message.isCycle()) node1->on_cycle(0, message.getCycle());
      if (message.isResponse()) node1->on_response(0, message.getResponse());
    }
    while (read0 < to_node0.size()) {
      const std::vector<uint8_t>& bytes = to_node0[read0++];
      const auto length = static_cast<uint32_t>(bytes.size());
      const auto* raw = reinterpret_cast<const uint8_t*>(&length);
      conversation.insert(conversation.end(), raw, raw + 4);
      conversation.insert(conversation.end(), bytes.begin(), bytes.end());
      ipc::DecodedMessage decoded(bytes, kNodeMessageLimitWords);
      const auto message = decoded.root<wire::NodeMessage>();
      if (message.isCycle()) node0->on_cycle(1, message.getCycle());
      if (message.isResponse()) node0->on_response(1, message.getResponse());
    }
  }
  // The whole conversation, and its first message alone.
  std::vector<std::vector<uint8_t>> seeds{conversation};
  if (!to_node0.empty()) {
    const auto length = static_cast<uint32_t>(to_node0[0].size());
    std::vector<uint8_t> first(reinterpret_cast<const uint8_t*>(&length),
                               reinterpret_cast<const uint8_t*>(&length) + 4);
    first.insert(first.end(), to_node0[0].begin(), to_node0[0].end());
    seeds.push_back(std::move(first));
  }
  return seeds;
}

}  // namespace gradsync::fuzz
