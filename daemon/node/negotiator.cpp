#include "daemon/node/negotiator.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gradsync::daemon {
namespace {

void set_bit(std::vector<uint64_t>& bits, uint32_t bit) {
  if (bits.size() <= bit / 64) bits.resize(bit / 64 + 1);
  bits[bit / 64] |= uint64_t{1} << (bit % 64);
}

std::vector<uint64_t> read_bits(capnp::List<uint64_t>::Reader list) {
  std::vector<uint64_t> bits;
  bits.reserve(list.size());
  for (const uint64_t word : list) bits.push_back(word);
  return bits;
}

// A peer's report of a ready collective. Its kind, dtype and op are checked before they become
// enum values: a value outside an enum is no value at all (found by tests/fuzz).
Proposal read_proposal(wire::Ready::Reader ready) {
  Proposal p;
  p.key = ready.getKey();
  const auto collective = ipc::parse_collective(ready.getCollective());
  const auto dtype = ipc::parse_dtype(ready.getDtype());
  const auto op = ipc::parse_op(ready.getOp());
  if (!collective || !dtype || !op) {
    throw std::invalid_argument(
        fmt::format("a peer reported '{}' with collective {}, dtype {}, op {}: not all known",
                    p.key, ready.getCollective(), ready.getDtype(), ready.getOp()));
  }
  p.signature.collective = *collective;
  p.signature.dtype = *dtype;
  p.signature.op = *op;
  p.signature.count = ready.getCount();
  p.signature.members = ready.getMembers();
  p.signature.root = ready.getRoot();
  p.ranks = ready.getRanks();
  return p;
}

void write_proposal(const Proposal& p, const std::string& ranks, wire::Ready::Builder ready) {
  ready.setKey(p.key);
  ready.setCollective(static_cast<uint8_t>(p.signature.collective));
  ready.setDtype(static_cast<uint8_t>(p.signature.dtype));
  ready.setOp(static_cast<uint8_t>(p.signature.op));
  ready.setCount(p.signature.count);
  ready.setMembers(p.signature.members);
  ready.setRoot(p.signature.root);
  ready.setRanks(ranks);
}

}  // namespace

wire::NodeMessage::Builder start_node_message(capnp::MessageBuilder& message,
                                              const std::string& job, uint32_t node) {
  auto root = message.initRoot<wire::NodeMessage>();
  root.setJob(job);
  root.setNode(node);
  return root;
}

std::span<const std::span<const uint8_t>> CycleDecisions::contributions_of(
    const Decision& decision) const {
  if (decision.contributions == Decision::kNoContributions) return {};
  return std::span(contributions).subspan(decision.contributions, eager_bytes.size());
}

void Negotiator::EagerSet::add(uint32_t bit, std::span<const uint8_t> data) {
  // The reduce kernels read each entry as an array of its dtype: every entry starts where the
  // allocator's alignment would (an f16 entry of odd count must not misalign the f32 after it).
  const size_t offset = aligned_offset(bytes.size());
  entries.push_back({bit, offset, data.size()});
  bytes.resize(offset);
  bytes.insert(bytes.end(), data.begin(), data.end());
}

const Negotiator::EagerSet::Entry* Negotiator::EagerSet::seek(uint32_t bit, size_t& cursor) const {
  while (cursor < entries.size() && entries[cursor].bit < bit) ++cursor;
  return cursor < entries.size() && entries[cursor].bit == bit ? &entries[cursor] : nullptr;
}

Negotiator::Negotiator(std::string job, uint32_t nodes, uint32_t me, std::string ranks,
                       uint32_t cache_capacity, LinkFigures own_link, SendFn send,
                       bool hold_empty_joins)
    : job_(std::move(job)),
      last_cycles_(nodes, 0),
      nodes_(nodes),
      me_(me),
      ranks_(std::move(ranks)),
      own_link_(own_link),
      agreed_link_(own_link),
      agreed_eager_max_bytes_(eager_max_bytes(own_link, nodes)),
      send_(std::move(send)),
      cache_(cache_capacity),
      hold_empty_joins_(hold_empty_joins) {}

void Negotiator::release_hold() {
  if (!holding_) return;
  hold_released_ = true;
  advance();
}

void Negotiator::propose(Proposal proposal, bool more_coming) {
  // Names of finished collectives linger as empty entries; sweep them when they pile up.
  constexpr size_t kMaxIdleNames = 1 << 16;
  if (pending_.size() > kMaxIdleNames + pending_count_) {
    std::erase_if(pending_, [](const auto& entry) { return entry.second.instances.empty(); });
  }
  PendingName& name = pending_[proposal.key];
  name.instances.push_back(std::move(proposal));
  ++pending_count_;
  if (!more_coming) advance();
}

Negotiator::CycleState& Negotiator::cycle_state(uint64_t number) {
  CycleState& state = cycles_[number];
  if (state.from.empty()) state.from.resize(nodes_);
  return state;
}

void Negotiator::on_cycle(uint32_t node, wire::Cycle::Reader cycle) {
  const uint64_t number = cycle.getNumber();
  // A peer can be at most one cycle ahead: it cannot finish a cycle without our message.
  if (number != cycle_ + 1 && !(in_cycle_ && number == cycle_)) {
    throw std::invalid_argument(fmt::format(
        "job '{}': node {} sent cycle {} while this node is at {}", job_, node, number, cycle_));
  }
  CycleState& state = cycle_state(number);
  if (state.from[node]) {
    throw std::invalid_argument(
        fmt::format("job '{}': node {} sent cycle {} twice", job_, node, number));
  }
  // A peer reports at most this many names a cycle: more would cost the coordinator time
  // quadratic in their number (tests/fuzz found a message of a few hundred bytes that lists
  // millions of empty reports).
  if (cycle.getUncached().size() > kMaxUncachedPerCycle) {
    throw std::invalid_argument(
        fmt::format("job '{}': node {} reported {} names in cycle {}, more "
                    "than the {} a node sends",
                    job_, node, cycle.getUncached().size(), number, kMaxUncachedPerCycle));
  }
  NodeCycle from;
  from.ready_bits = read_bits(cycle.getReadyBits());
  from.invalid_bits = read_bits(cycle.getInvalidBits());
  for (auto ready : cycle.getUncached()) from.uncached.push_back(read_proposal(ready));
  from.link = {cycle.getAlphaSeconds(), cycle.getBetaSecondsPerByte(),
               cycle.getGammaSecondsPerByte()};
  uint32_t last_bit = 0;
  from.eager.entries.reserve(cycle.getEager().size());
  for (auto contribution : cycle.getEager()) {
    if (!from.eager.entries.empty() && contribution.getBit() <= last_bit) {
      throw std::invalid_argument(
          fmt::format("job '{}': node {} sent cycle {} with its contributions out of order", job_,
                      node, number));
    }
    last_bit = contribution.getBit();
    const auto data = contribution.getData();
    from.eager.add(last_bit, std::span(data.begin(), data.size()));
  }
  state.from[node] = std::move(from);
  ++state.received;
  last_cycles_[node] = number;
  advance();
}

void Negotiator::on_response(uint32_t node, wire::CycleResponse::Reader response) {
  const uint64_t number = response.getNumber();
  if (node != 0 || !in_cycle_ || number != cycle_) {
    throw std::invalid_argument(
        fmt::format("job '{}': unexpected response to cycle {} from node {}", job_, number, node));
  }
  std::vector<Decision> decisions;
  for (auto d : response.getDecisions()) decisions.push_back({d.getKey(), d.getError()});
  cycle_state(number).response = std::move(decisions);
  advance();
}

void Negotiator::advance() {
  while (in_cycle_ ? complete_cycle() : start_cycle_if_due()) {
  }
}

Negotiator::NodeCycle Negotiator::own_state() const {
  NodeCycle state;
  state.link = own_link_;
  size_t eager_bytes = 0;
  std::vector<std::pair<uint32_t, const std::vector<uint8_t>*>> eager;
  for (const auto& [key, name] : pending_) {
    if (name.instances.empty()) continue;
    if (!reported_.empty() && reported_.contains(key)) {
      continue;  // its oldest instance waits for the coordinator
    }
    if (name.cache_generation != cache_.generation()) {
      const auto cached = cache_.find(key);
      name.cache_bit = cached ? cached->bit : PendingName::kNoBit;
      name.cache_generation = cache_.generation();
    }
    const Proposal& oldest = name.instances.front();
    if (const uint32_t bit = name.cache_bit; bit != PendingName::kNoBit) {
      const bool same = cache_.signature_of(bit) == oldest.signature;
      set_bit(same ? state.ready_bits : state.invalid_bits, bit);
      if (same && !oldest.eager.empty() &&
          eager_bytes + oldest.eager.size() <= kEagerMaxTotalBytes) {
        eager_bytes += oldest.eager.size();
        eager.emplace_back(bit, &oldest.eager);
      }
    } else if (state.uncached.size() < kMaxUncachedPerCycle) {
      state.uncached.push_back(oldest);
    }
  }
  std::sort(eager.begin(), eager.end());
  state.eager.bytes.reserve(eager_bytes + eager.size() * (EagerSet::kAlignment - 1));
  for (const auto& [bit, data] : eager) state.eager.add(bit, *data);
  return state;
}

bool Negotiator::start_cycle_if_due() {
  NodeCycle state = own_state();
  const auto next = cycles_.find(cycle_ + 1);
  const bool peer_started = next != cycles_.end() && next->second.received > 0;
  if (!peer_started && state.uncached.empty() && state.invalid_bits.empty() &&
      state.ready_bits == last_ready_bits_) {
    return false;
  }
  const bool nothing_at_all = state.uncached.empty() && state.invalid_bits.empty() &&
                              reported_.empty() &&
                              std::all_of(state.ready_bits.begin(), state.ready_bits.end(),
                                          [](uint64_t word) { return word == 0; });
  if (hold_empty_joins_ && nothing_at_all && !hold_released_) {
    holding_ = true;
    return false;
  }
  holding_ = false;
  hold_released_ = false;
  ++cycle_;
  in_cycle_ = true;
  ++counters_.cycles;
  last_cycles_[me_] = cycle_;
  last_ready_bits_ = state.ready_bits;
  for (const auto& p : state.uncached) {
    reported_.insert(p.key);
    ++counters_.cache_misses;
  }
  capnp::MallocMessageBuilder message;
  auto cycle = start_node_message(message, job_, me_).initCycle();
  cycle.setNumber(cycle_);
  auto ready = cycle.initReadyBits(static_cast<unsigned>(state.ready_bits.size()));
  for (unsigned i = 0; i < ready.size(); ++i) ready.set(i, state.ready_bits[i]);
  auto invalid = cycle.initInvalidBits(static_cast<unsigned>(state.invalid_bits.size()));
  for (unsigned i = 0; i < invalid.size(); ++i) invalid.set(i, state.invalid_bits[i]);
  auto uncached = cycle.initUncached(static_cast<unsigned>(state.uncached.size()));
  for (unsigned i = 0; i < uncached.size(); ++i) {
    write_proposal(state.uncached[i], ranks_, uncached[i]);
  }
  cycle.setAlphaSeconds(own_link_.alpha_seconds);
  cycle.setBetaSecondsPerByte(own_link_.beta_seconds_per_byte);
  cycle.setGammaSecondsPerByte(own_link_.gamma_seconds_per_byte);
  auto eager = cycle.initEager(static_cast<unsigned>(state.eager.entries.size()));
  for (unsigned e = 0; e < eager.size(); ++e) {
    const auto& entry = state.eager.entries[e];
    eager[e].setBit(entry.bit);
    eager[e].setData(kj::arrayPtr(state.eager.bytes.data() + entry.offset, entry.size));
  }
  for (uint32_t node = 0; node < nodes_; ++node) {
    if (node != me_) send_(node, message);
  }
  CycleState& own = cycle_state(cycle_);
  own.from[me_] = std::move(state);
  ++own.received;
  return true;
}

bool Negotiator::complete_cycle() {
  CycleState& state = cycle_state(cycle_);
  if (state.received < nodes_) return false;
  const bool any_uncached = std::any_of(state.from.begin(), state.from.end(),
                                        [](const auto& n) { return !n->uncached.empty(); });
  if (any_uncached && !state.response) {
    if (me_ != 0) return false;  // the coordinator's answer is on its way
    state.response = coordinate(state);
    capnp::MallocMessageBuilder message;
    auto response = start_node_message(message, job_, me_).initResponse();
    response.setNumber(cycle_);
    auto decisions = response.initDecisions(static_cast<unsigned>(state.response->size()));
    for (unsigned i = 0; i < decisions.size(); ++i) {
      decisions[i].setKey((*state.response)[i].key);
      decisions[i].setError((*state.response)[i].error);
    }
    for (uint32_t node = 1; node < nodes_; ++node) send_(node, message);
  }
  apply(state);
  cycles_.erase(cycle_);
  in_cycle_ = false;
  return true;
}

std::vector<Decision> Negotiator::coordinate(const CycleState& state) {
  std::vector<Decision> decisions;
  for (uint32_t node = 0; node < nodes_; ++node) {
    for (const Proposal& p : state.from[node]->uncached) {
      auto& entries = coordinator_[p.key];
      // The first entry this node has not reported yet: every node reports a name's
      // instances in order.
      auto entry = std::find_if(entries.begin(), entries.end(),
                                [node](const CoordinatorEntry& e) { return !e.reported[node]; });
      if (entry == entries.end()) {
        entries.push_back(CoordinatorEntry{std::vector<bool>(nodes_), 0, {}, 0, {}, {}});
        entry = std::prev(entries.end());
      }
      const std::string& ranks = node == me_ ? ranks_ : p.ranks;
      if (entry->count == 0) {
        entry->signature = p.signature;
        entry->first_node = node;
        entry->first_ranks = ranks;
      } else if (entry->signature != p.signature && entry->mismatch.empty()) {
        entry->mismatch =
            fmt::format("tensor '{}': nodes disagree: node {} has {} ({}); node {} has {} ({})",
                        p.key, entry->first_node, entry->signature.describe(), entry->first_ranks,
                        node, p.signature.describe(), ranks);
      }
      entry->reported[node] = true;
      ++entry->count;
      while (!entries.empty() && entries.front().count == nodes_) {
        decisions.push_back({p.key, entries.front().mismatch});
        entries.pop_front();
      }
      if (entries.empty()) coordinator_.erase(p.key);
    }
  }
  return decisions;
}

void Negotiator::apply(CycleState& state) {
  // Cached collectives every node has ready, by ascending bit.
  std::vector<uint64_t> all_ready = state.from[0]->ready_bits;
  std::vector<uint64_t> any_invalid;
  for (const auto& from : state.from) {
    all_ready.resize(std::min(all_ready.size(), from->ready_bits.size()));
    for (size_t w = 0; w < all_ready.size(); ++w) all_ready[w] &= from->ready_bits[w];
    if (any_invalid.size() < from->invalid_bits.size()) {
      any_invalid.resize(from->invalid_bits.size());
    }
    for (size_t w = 0; w < from->invalid_bits.size(); ++w) any_invalid[w] |= from->invalid_bits[w];
  }
  // Every node sees the same figures: take the largest, the cautious estimate.
  agreed_link_ = {};
  for (const auto& from : state.from) {
    agreed_link_.alpha_seconds = std::max(agreed_link_.alpha_seconds, from->link.alpha_seconds);
    agreed_link_.beta_seconds_per_byte =
        std::max(agreed_link_.beta_seconds_per_byte, from->link.beta_seconds_per_byte);
    agreed_link_.gamma_seconds_per_byte =
        std::max(agreed_link_.gamma_seconds_per_byte, from->link.gamma_seconds_per_byte);
  }
  agreed_eager_max_bytes_ = eager_max_bytes(agreed_link_, nodes_);
  peer_ready_bits_.resize(nodes_);
  for (uint32_t node = 0; node < nodes_; ++node) {
    peer_ready_bits_[node] = state.from[node]->ready_bits;
  }
  CycleDecisions decided{cycle_, agreed_link_, {}, {}, {}};
  size_t ready_count = state.response ? state.response->size() : 0;
  for (const uint64_t word : all_ready)
    ready_count += static_cast<size_t>(__builtin_popcountll(word));
  decided.decisions.reserve(ready_count);
  decided.contributions.reserve(ready_count * nodes_);
  std::vector<size_t> eager_cursors(nodes_, 0);  // bits come in ascending order, as entries do
  std::vector<const EagerSet::Entry*> eager(nodes_);
  for (size_t w = 0; w < all_ready.size(); ++w) {
    for (uint64_t word = all_ready[w]; word != 0; word &= word - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(word)));
      const std::string* key = cache_.key_of(bit);
      if (key == nullptr) {
        throw std::invalid_argument(
            fmt::format("job '{}': cycle {} runs cache bit {}, which is free", job_, cycle_, bit));
      }
      cache_.touch(bit);
      ++counters_.cache_hits;
      Proposal taken = take_front(*key);
      Decision& decision = decided.decisions.emplace_back(
          Decision{std::move(taken.key), {}, Decision::kNoContributions, taken.cookie});
      bool everyone_sent_data = true;
      for (uint32_t node = 0; node < nodes_; ++node) {
        eager[node] = state.from[node]->eager.seek(bit, eager_cursors[node]);
        everyone_sent_data &= eager[node] != nullptr;
      }
      if (everyone_sent_data) {
        decision.contributions = decided.contributions.size();
        for (uint32_t node = 0; node < nodes_; ++node) {
          // Points into the buffer moved into `decided` below, which keeps its storage.
          decided.contributions.emplace_back(
              state.from[node]->eager.bytes.data() + eager[node]->offset, eager[node]->size);
        }
      }
      // No longer part of this node's state: a later instance of the name sets it anew, and
      // is then a change worth a cycle.
      if (bit / 64 < last_ready_bits_.size()) {
        last_ready_bits_[bit / 64] &= ~(uint64_t{1} << (bit % 64));
      }
    }
  }
  if (!decided.contributions.empty()) {
    for (auto& from : state.from) decided.eager_bytes.push_back(std::move(from->eager.bytes));
  }
  for (size_t w = 0; w < any_invalid.size(); ++w) {
    for (uint64_t word = any_invalid[w]; word != 0; word &= word - 1) {
      cache_.erase(static_cast<uint32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(word))));
    }
  }
  // Compared with later states, which carry no trailing empty words.
  while (!last_ready_bits_.empty() && last_ready_bits_.back() == 0) last_ready_bits_.pop_back();
  // Then what the coordinator decided, in its order; agreed ones join the cache.
  if (state.response) {
    for (const Decision& d : *state.response) {
      const auto it = pending_.find(d.key);
      if (it == pending_.end() || it->second.instances.empty() || !reported_.contains(d.key)) {
        throw std::invalid_argument(fmt::format(
            "job '{}': the coordinator decided '{}', which this node did not report", job_, d.key));
      }
      if (d.error.empty() && cache_.capacity() > 0) {
        cache_.put(d.key, it->second.instances.front().signature);
      }
      reported_.erase(d.key);
      Decision& decision = decided.decisions.emplace_back(d);
      decision.cookie = take_front(d.key).cookie;
    }
  }
  if (!decided.decisions.empty()) decided_.push_back(std::move(decided));
}

std::vector<uint32_t> Negotiator::nodes_without(const std::string& key) const {
  std::vector<uint32_t> missing;
  if (const auto cached = cache_.find(key)) {
    const uint32_t bit = cached->bit;
    for (uint32_t node = 0; node < nodes_; ++node) {
      if (node == me_) continue;
      const bool has = node < peer_ready_bits_.size() && bit / 64 < peer_ready_bits_[node].size() &&
                       ((peer_ready_bits_[node][bit / 64] >> (bit % 64)) & 1) != 0;
      if (!has) missing.push_back(node);
    }
  } else if (const auto it = coordinator_.find(key); it != coordinator_.end()) {
    const CoordinatorEntry& oldest = it->second.front();
    for (uint32_t node = 0; node < nodes_; ++node) {
      if (node != me_ && !oldest.reported[node]) missing.push_back(node);
    }
  }
  return missing;
}

Proposal Negotiator::take_front(const std::string& key) {
  Fifo<Proposal>& instances = pending_.find(key)->second.instances;
  Proposal taken = std::move(instances.front());
  instances.pop_front();
  --pending_count_;
  return taken;
}

}  // namespace gradsync::daemon
