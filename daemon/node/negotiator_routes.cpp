// How a cycle's parts travel between the nodes (negotiator.h, "Routes"): straight to every
// node, or relayed.
#include "daemon/node/negotiator.h"

#include <bit>

namespace gradsync::daemon {

void Negotiator::send_own_part(CycleState& own) {
  if (route_ == CycleRoute::kRelayed) {
    relay(own);
    return;
  }
  capnp::MallocMessageBuilder message;
  write_part(me_, *own.from[me_], cycle_, start_node_message(message, job_, me_).initCycle());
  for (uint32_t node = 0; node < nodes_; ++node) {
    if (node != me_) send_(node, message);
  }
  counters_.cycle_messages += nodes_ - 1;
}

template <typename Include>
void Negotiator::send_parts(uint32_t to, const CycleState& state, Include include) {
  unsigned count = 0;
  for (uint32_t node = 0; node < nodes_; ++node) count += include(node) ? 1 : 0;
  capnp::MallocMessageBuilder message;
  auto parts = start_node_message(message, job_, me_).initRelay(count);
  unsigned i = 0;
  for (uint32_t node = 0; node < nodes_; ++node) {
    if (!include(node)) continue;
    parts[i].setOrigin(node);
    write_part(node, *state.from[node], cycle_, parts[i].initCycle());
    ++i;
  }
  send_(to, message);
  ++counters_.cycle_messages;
}

void Negotiator::relay(CycleState& state) {
  if (!state.from[me_]) return;  // not started here: nothing of this node's to pass on yet
  if (me_ >= relay_width_) {
    // Past the p nodes that exchange: hand this node's part to its partner among them, which
    // sends every other part back once it has them all.
    if (state.relays_sent == 0) {
      send_parts(me_ - relay_width_, state, [this](uint32_t node) { return node == me_; });
      state.relays_sent = 1;
    }
    return;
  }
  const uint32_t handed_in = me_ + relay_width_;
  if (handed_in < nodes_ && !state.from[handed_in] && !state.told_handed_in) {
    // The node that hands its part in hears of cycles from this node only: without a word it
    // would not join one it has nothing new for, and every other node would wait for it.
    send_parts(handed_in, state, [this](uint32_t node) { return node == me_; });
    state.told_handed_in = true;
  }
  // Hop h goes to the node 2^h away with the parts of this node's block of 2^h nodes (and of
  // the nodes past p that handed theirs to one of them): all of them must be here first.
  auto in_block = [this](uint32_t node, uint32_t hop) {
    return (relay_slot(node) >> hop) == (me_ >> hop);
  };
  auto block_known = [&](uint32_t hop) {
    for (uint32_t node = 0; node < nodes_; ++node) {
      if (in_block(node, hop) && !state.from[node]) return false;
    }
    return true;
  };
  while (state.relays_sent < relay_levels_ && block_known(state.relays_sent)) {
    const uint32_t hop = state.relays_sent;
    send_parts(me_ ^ (1u << hop), state, [&](uint32_t node) { return in_block(node, hop); });
    ++state.relays_sent;
  }
  if (state.relays_sent == relay_levels_ && handed_in < nodes_ && state.received == nodes_) {
    send_parts(handed_in, state, [&](uint32_t node) {
      return node != handed_in && !(node == me_ && state.told_handed_in);
    });
    ++state.relays_sent;
  }
}

bool Negotiator::relays_through(uint32_t sender, uint32_t origin) const {
  if (sender >= relay_width_) return origin == sender && me_ == sender - relay_width_;
  if (me_ >= relay_width_) return sender == me_ - relay_width_;
  const uint32_t distance = sender ^ me_;
  if (!std::has_single_bit(distance)) return false;
  const int hop = std::countr_zero(distance);
  return (relay_slot(origin) >> hop) == (sender >> hop);
}

}  // namespace gradsync::daemon
