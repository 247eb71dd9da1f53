#include "tests/fuzz/negotiation_fuzzing.h"

#include "ipc/messages.h"
#include "tests/fuzz/fuzz_target.h"

#include <kj/exception.h>

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>

namespace gradsync::fuzz {
namespace {

using daemon::CycleDecisions;
using daemon::Decision;
using daemon::Negotiator;
using daemon::Proposal;

constexpr uint32_t kProposals = 6;  // 3 names, 2 steps
constexpr uint32_t kEagerBytes = 64;

Proposal proposal(uint32_t i) {
  Proposal p;
  p.key = "grad." + std::to_string(i % 3);
  p.signature.collective = ipc::Collective::kAllreduce;
  p.signature.count = i % 3 == 0 ? kEagerBytes / 4 : 1 << 20;
  p.piggybacks = i % 3 == 0;
  if (p.piggybacks) p.eager.assign(kEagerBytes, static_cast<uint8_t>(i));
  p.cookie = i;
  return p;
}

std::unique_ptr<Negotiator> make_node(const NegotiationShape& shape, uint32_t me,
                                      Negotiator::SendFn send) {
  auto node = std::make_unique<Negotiator>("job", shape.nodes, me, "ranks " + std::to_string(me),
                                           16, cost_model::LinkFigures{1e-5, 1e-9, 1e-10},
                                           std::move(send), false, shape.route);
  for (uint32_t i = 0; i < kProposals; ++i) node->propose(proposal(i), i + 1 < kProposals);
  return node;
}

// As NodeJob hands a peer's message to the negotiator.
void dispatch(Negotiator& node, uint32_t from, daemon::wire::NodeMessage::Reader message) {
  if (message.isCycle()) node.on_cycle(from, message.getCycle());
  if (message.isRelay()) node.on_relay(from, message.getRelay());
}

void append_frame(std::vector<uint8_t>& frames, const std::vector<uint8_t>& bytes) {
  const auto length = static_cast<uint32_t>(bytes.size());
  const auto* raw = reinterpret_cast<const uint8_t*>(&length);
  frames.insert(frames.end(), raw, raw + 4);
  frames.insert(frames.end(), bytes.begin(), bytes.end());
}

// Runs the frames of `data` (each a 4-byte length, then that many bytes of a Cap'n Proto
// message) through node `shape.me`, which has proposed the same collectives as in seeds_for.
void read_frames(const NegotiationShape& shape, const uint8_t* data, size_t size) {
  auto node = make_node(shape, shape.me, [](uint32_t, capnp::MessageBuilder&) {});
  std::set<uint64_t> decided;
  while (size >= 4) {
    uint32_t length = 0;
    std::memcpy(&length, data, 4);
    data += 4;
    size -= 4;
    if (length > size) length = static_cast<uint32_t>(size);
    const std::span<const uint8_t> frame(data, length);
    data += length;
    size -= length;
    try {
      ipc::DecodedMessage decoded(frame, daemon::kNodeMessageLimitWords);
      const auto message = decoded.root<daemon::wire::NodeMessage>();
      const uint32_t from = message.getNode();
      if (from >= shape.nodes || from == shape.me) return;  // NodeJob's check: fails the job
      dispatch(*node, from, message);
    } catch (const std::exception&) {  // as the engine: a refusal, or a frame that is no message
      return;                          // the first refusal fails the job: nothing more is read
    } catch (const kj::Exception&) {
      return;
    }
    for (const CycleDecisions& cycle : node->decided()) {
      for (const Decision& decision : cycle.decisions) {
        if (decision.cookie >= kProposals) violated("a decision for nothing proposed");
        if (!decided.insert(decision.cookie).second) violated("a proposal decided twice");
        const auto contributions = cycle.contributions_of(decision);
        if (!contributions.empty() && contributions.size() != shape.nodes) {
          violated("contributions of a decision are not one per node");
        }
      }
    }
    node->decided().clear();
  }
}

// What node `shape.me` reads in a real exchange, every node proposing the same collectives and
// the messages delivered until no node has more to say: the whole conversation, framed, and
// its first message alone.
std::vector<std::vector<uint8_t>> seeds_for(const NegotiationShape& shape) {
  std::map<std::pair<uint32_t, uint32_t>, std::deque<std::vector<uint8_t>>> queues;
  std::vector<std::unique_ptr<Negotiator>> nodes;
  for (uint32_t n = 0; n < shape.nodes; ++n) {
    nodes.push_back(make_node(shape, n, [&queues, n](uint32_t to, capnp::MessageBuilder& m) {
      queues[{n, to}].push_back(ipc::encode(m));
    }));
  }
  std::vector<uint8_t> conversation;  // what node `me` read, framed
  std::vector<uint8_t> first;
  for (bool moved = true; moved;) {
    moved = false;
    for (auto& [link, queue] : queues) {
      if (queue.empty()) continue;
      const std::vector<uint8_t> bytes = std::move(queue.front());
      queue.pop_front();
      moved = true;
      if (link.second == shape.me) {
        if (conversation.empty()) append_frame(first, bytes);
        append_frame(conversation, bytes);
      }
      ipc::DecodedMessage decoded(bytes, daemon::kNodeMessageLimitWords);
      dispatch(*nodes[link.second], link.first, decoded.root<daemon::wire::NodeMessage>());
      break;  // the map may have grown: look again from the first link
    }
  }
  std::vector<std::vector<uint8_t>> seeds{conversation};
  if (!first.empty()) seeds.push_back(std::move(first));
  return seeds;
}

}  // namespace

std::vector<std::vector<uint8_t>> seeds() {
  return seeds_for(kFuzzedShape);
}

}  // namespace gradsync::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gradsync::fuzz::read_frames(gradsync::fuzz::kFuzzedShape, data, size);
  return 0;
}
