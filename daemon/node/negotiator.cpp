#include "daemon/node/negotiator.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
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

// Node 0's tuned settings, within what autotune tries (autotune.h) and what the daemon can run:
// a piece of no bytes would be no pipeline at all.
TuningAnnouncement read_tuned(wire::TunedSettings::Reader tuned, const std::string& job,
                              uint32_t node, uint64_t number) {
  const TunedSettings settings{tuned.getFusionThresholdBytes(), tuned.getPieceBytes(),
                               tuned.getNegotiationHoldMicroseconds(), tuned.getRingMinBytes()};
  if (settings.piece_bytes < kMinTunedPieceBytes || settings.piece_bytes > kMaxTunedPieceBytes ||
      settings.negotiation_hold_us > kMaxTunedHoldMicroseconds) {
    throw std::invalid_argument(
        fmt::format("job '{}': node {} sent cycle {} with settings out of "
                    "range: {}",
                    job, node, number, describe(settings)));
  }
  return {settings, tuned.getSearchDone()};
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
  if (ipc::reduces(*collective) && !ipc::op_reduces(*op, *dtype)) {
    throw std::invalid_argument(fmt::format("a peer reported '{}' reducing {} by {}", p.key,
                                            ipc::dtype_name(*dtype), ipc::op_name(*op)));
  }
  p.signature.collective = *collective;
  p.signature.dtype = *dtype;
  p.signature.op = *op;
  p.signature.count = ready.getCount();
  p.signature.members = ready.getMembers();
  p.signature.root = ready.getRoot();
  p.signature.on_device = ready.getOnDevice();
  p.signature.priority = ready.getPriority();
  p.ranks = ready.getRanks();
  p.piggybacks = ready.getPiggybacks();
  const auto eager = ready.getEager();
  p.eager.assign(eager.begin(), eager.end());
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
  ready.setOnDevice(p.signature.on_device);
  ready.setPriority(p.signature.priority);
  ready.setRanks(ranks);
  ready.setPiggybacks(p.piggybacks);
  if (p.piggybacks) ready.setEager(kj::arrayPtr(p.eager.data(), p.eager.size()));
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
  return std::span(contributions).subspan(decision.contributions, nodes);
}

void Negotiator::EagerSet::add(uint32_t bit, std::span<const uint8_t> data) {
  // The reduce kernels read each entry as an array of its dtype: every entry starts where the
  // allocator's alignment would (an f16 entry of odd count must not misalign the f32 after it).
  const size_t offset = aligned_offset(bytes.size());
  entries.push_back({bit, offset, data.size()});
  bytes.resize(offset);  // the padding: this runs for every small tensor of a step
  bytes.insert(bytes.end(), data.begin(), data.end());
}

const Negotiator::EagerSet::Entry* Negotiator::EagerSet::seek(uint32_t bit, size_t& cursor) const {
  while (cursor < entries.size() && entries[cursor].bit < bit) ++cursor;
  return cursor < entries.size() && entries[cursor].bit == bit ? &entries[cursor] : nullptr;
}

Negotiator::Negotiator(std::string job, uint32_t nodes, uint32_t me, std::string ranks,
                       uint32_t cache_capacity, cost_model::LinkFigures own_link, SendFn send,
                       bool hold_empty_joins, CycleRoute route)
    : job_(std::move(job)),
      last_cycles_(nodes, 0),
      nodes_(nodes),
      me_(me),
      ranks_(std::move(ranks)),
      own_link_(own_link),
      agreed_link_(own_link),
      agreed_eager_max_bytes_(cost_model::kEagerMinBytes),
      send_(std::move(send)),
      cache_(cache_capacity),
      hold_empty_joins_(hold_empty_joins),
      route_(route),
      relay_width_(std::bit_floor(std::max(nodes, 1u))),
      relay_levels_(static_cast<uint32_t>(std::countr_zero(relay_width_))),
      uncached_per_part_(route == CycleRoute::kRelayed && nodes > 2
                             ? std::max<size_t>(kMaxUncachedPerCycle / (nodes - 1), 1)
                             : kMaxUncachedPerCycle),
      eager_bytes_per_part_(route == CycleRoute::kRelayed && nodes > 2
                                ? kEagerMaxTotalBytes / (nodes - 1)
                                : kEagerMaxTotalBytes) {}

void Negotiator::release_hold() {
  if (!holding_) return;
  hold_released_ = true;
  advance();
}

void Negotiator::propose(Proposal proposal, bool more_coming) {
  const std::string key = std::move(proposal.key);
  propose(key, std::move(proposal), more_coming);
}

void Negotiator::propose(std::string_view key, Proposal proposal, bool more_coming) {
  const NameId id = intern(key);
  PendingName& name = names_[id];
  if (name.instances.empty()) {
    name.active_slot = active_.size();
    active_.push_back(id);
  }
  name.instances.push_back(std::move(proposal));
  ++pending_count_;
  changed_ = true;
  if (!more_coming) advance();
}

std::vector<uint8_t> Negotiator::eager_storage() {
  if (spare_eager_.empty()) return {};
  std::vector<uint8_t> storage = std::move(spare_eager_.back());
  spare_eager_.pop_back();
  return storage;
}

NameId Negotiator::intern(std::string_view key) {
  // A freed id's key is empty, and a reused one's another name: a stale guess fails here.
  if (last_interned_ != kNoName) {
    const NameId guess = names_[last_interned_].proposed_next;
    if (guess != kNoName && names_[guess].key == key) return last_interned_ = guess;
  }
  NameId id = 0;
  if (const auto it = ids_.find(key); it != ids_.end()) {
    id = it->second;
  } else {
    sweep_idle_names();
    if (free_ids_.empty()) {
      id = static_cast<NameId>(names_.size());
      names_.emplace_back();
    } else {
      id = free_ids_.back();
      free_ids_.pop_back();
    }
    names_[id].key.assign(key);
    ids_.emplace(names_[id].key, id);
  }
  if (last_interned_ != kNoName) names_[last_interned_].proposed_next = id;
  return last_interned_ = id;
}

void Negotiator::sweep_idle_names() {
  // Names of finished collectives stay for the next step; an application that names each
  // collective afresh (or never names them) would pile them up.
  constexpr size_t kMaxIdleNames = 1 << 16;
  if (ids_.size() <= kMaxIdleNames + pending_count_) return;
  std::erase_if(ids_, [this](const auto& entry) {
    PendingName& name = names_[entry.second];
    if (!name.instances.empty() || name.reported) return false;
    free_ids_.push_back(entry.second);
    name = PendingName{};
    return true;
  });
}

Negotiator::CycleState& Negotiator::cycle_state(uint64_t number) {
  CycleState& state = cycles_[number];
  if (state.from.empty()) state.from.resize(nodes_);
  return state;
}

void Negotiator::on_cycle(uint32_t node, wire::Cycle::Reader cycle) {
  // Each route has its own message: a part sent directly in a job that relays them (or the
  // other way round) comes from a peer that took another route, and would be a part twice.
  if (route_ != CycleRoute::kDirect) {
    throw std::invalid_argument(fmt::format(
        "job '{}': node {} sent its cycle directly in a job that relays them", job_, node));
  }
  take_part(node, cycle);
  advance();
}

void Negotiator::on_relay(uint32_t node, capnp::List<wire::RelayedCycle>::Reader parts) {
  if (route_ != CycleRoute::kRelayed) {
    throw std::invalid_argument(fmt::format(
        "job '{}': node {} relayed cycles in a job that sends them directly", job_, node));
  }
  for (const auto part : parts) {
    const uint32_t origin = part.getOrigin();
    if (origin >= nodes_ || origin == me_) {
      throw std::invalid_argument(
          fmt::format("job '{}': node {} passed on a cycle of node {}", job_, node, origin));
    }
    // Each part reaches this node by one way only: from another node it would be a part the
    // sender cannot have yet, or one that could come twice.
    if (!relays_through(node, origin)) {
      throw std::invalid_argument(
          fmt::format("job '{}': node {} passed on node {}'s cycle, which the relayed route "
                      "does not bring through it",
                      job_, node, origin));
    }
    take_part(origin, part.getCycle());
  }
  advance();
}

void Negotiator::take_part(uint32_t node, wire::Cycle::Reader cycle) {
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
  // A peer reports at most this many names a cycle: more would cost every node time
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
  size_t report_bytes = 0;
  for (auto ready : cycle.getUncached()) {
    from.uncached.push_back(read_proposal(ready));
    report_bytes += from.uncached.back().eager.size();
  }
  // Kept until every node has reported the same name: no more than a node sends a cycle.
  if (report_bytes > kEagerMaxTotalBytes) {
    throw std::invalid_argument(
        fmt::format("job '{}': node {} sent {} bytes of contributions with its reports in "
                    "cycle {}, more than the {} a node sends",
                    job_, node, report_bytes, number, kEagerMaxTotalBytes));
  }
  from.link = {cycle.getAlphaSeconds(), cycle.getBetaSecondsPerByte(),
               cycle.getGammaSecondsPerByte()};
  read_eager(cycle, from.eager, node, number);
  if (node == 0 && cycle.hasTuned()) {
    from.tuned = read_tuned(cycle.getTuned(), job_, node, number);
  }
  state.from[node] = std::move(from);
  ++state.received;
  last_cycles_[node] = number;
}

void Negotiator::read_eager(wire::Cycle::Reader cycle, EagerSet& eager, uint32_t node,
                            uint64_t number) const {
  const auto bits = cycle.getEagerBits();
  const auto sizes = cycle.getEagerSizes();
  const auto data = cycle.getEagerData();
  auto malformed = [&](std::string_view what) {
    return std::invalid_argument(
        fmt::format("job '{}': node {} sent cycle {} with {}", job_, node, number, what));
  };
  if (bits.size() != sizes.size()) throw malformed("as many contribution sizes as bits");
  eager.entries.reserve(bits.size());
  size_t offset = 0;
  for (unsigned i = 0; i < bits.size(); ++i) {
    if (i > 0 && bits[i] <= bits[i - 1]) throw malformed("its contributions out of order");
    offset = EagerSet::aligned_offset(offset);
    if (offset > data.size() || sizes[i] > data.size() - offset) {
      throw malformed("contributions past the end of their data");
    }
    eager.entries.push_back({bits[i], offset, sizes[i]});
    offset += sizes[i];
  }
  eager.bytes.assign(data.begin(), data.end());
}

void Negotiator::advance() {
  while (in_cycle_ ? complete_cycle() : start_cycle_if_due()) {
  }
}

Negotiator::NodeCycle Negotiator::own_state() const {
  NodeCycle state;
  state.link = own_link_;
  state.tuned = announced_;
  size_t eager_bytes = 0;
  size_t eager_count = 0;
  for (const NameId id : active_) {
    const PendingName& name = names_[id];
    if (name.reported) continue;  // its oldest instance waits for every node's report
    if (name.cache_generation != cache_.generation()) {
      const auto cached = cache_.find(name.key);
      name.cache_bit = cached ? cached->bit : PendingName::kNoBit;
      name.cache_generation = cache_.generation();
    }
    const Proposal& oldest = name.instances.front();
    if (const uint32_t bit = name.cache_bit; bit != PendingName::kNoBit) {
      const bool same = cache_.signature_of(bit) == oldest.signature;
      set_bit(same ? state.ready_bits : state.invalid_bits, bit);
      if (!same) continue;
      // apply's way back from the bit: no own_state runs between a cycle's start and its end,
      // so the look that starts a cycle writes the names it decides.
      if (bit_names_.size() <= bit) bit_names_.resize(cache_.bit_span(), kNoName);
      bit_names_[bit] = id;
      if (oldest.piggybacks && eager_bytes + oldest.eager.size() <= eager_bytes_per_part_) {
        eager_bytes += oldest.eager.size();
        ++eager_count;
        if (eager_by_bit_.size() <= bit) eager_by_bit_.resize(cache_.bit_span(), nullptr);
        eager_by_bit_[bit] = &oldest.eager;
      }
    } else if (state.uncached.size() < uncached_per_part_) {
      Proposal& report = state.uncached.emplace_back();
      report.key = name.key;
      report.signature = oldest.signature;
      if (oldest.piggybacks && eager_bytes + oldest.eager.size() <= eager_bytes_per_part_) {
        eager_bytes += oldest.eager.size();
        report.piggybacks = true;
        report.eager = oldest.eager;  // the instance keeps its own: this state may go unsent
      }
      state.uncached_names.push_back(id);
    }
  }
  if (eager_count == 0) return state;
  // The contributions go by ascending bit: the ready bits' order, without a sort.
  state.eager.bytes.reserve(eager_bytes + eager_count * (EagerSet::kAlignment - 1));
  state.eager.entries.reserve(eager_count);
  for (size_t w = 0; w < state.ready_bits.size(); ++w) {
    for (uint64_t word = state.ready_bits[w]; word != 0; word &= word - 1) {
      const size_t bit = w * 64 + static_cast<size_t>(__builtin_ctzll(word));
      if (bit < eager_by_bit_.size() && eager_by_bit_[bit] != nullptr) {
        state.eager.add(static_cast<uint32_t>(bit), *eager_by_bit_[bit]);
        eager_by_bit_[bit] = nullptr;
      }
    }
  }
  return state;
}

bool Negotiator::start_cycle_if_due() {
  const auto next = cycles_.find(cycle_ + 1);
  const bool peer_started = next != cycles_.end() && next->second.received > 0;
  // Nothing proposed or decided since a look that found nothing new: it would find the same.
  if (!peer_started && !changed_) return false;
  NodeCycle state = own_state();
  if (!peer_started && state.uncached.empty() && state.invalid_bits.empty() &&
      state.ready_bits == last_ready_bits_) {
    changed_ = false;
    return false;
  }
  const bool nothing_at_all = state.uncached.empty() && state.invalid_bits.empty() &&
                              reported_count_ == 0 &&
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
  for (const NameId id : state.uncached_names) {
    names_[id].reported = true;
    ++reported_count_;
    ++counters_.cache_misses;
  }
  CycleState& own = cycle_state(cycle_);
  own.from[me_] = std::move(state);
  ++own.received;
  send_own_part(own);
  return true;
}

void Negotiator::write_part(uint32_t origin, const NodeCycle& part, uint64_t number,
                            wire::Cycle::Builder cycle) const {
  cycle.setNumber(number);
  auto ready = cycle.initReadyBits(static_cast<unsigned>(part.ready_bits.size()));
  for (unsigned i = 0; i < ready.size(); ++i) ready.set(i, part.ready_bits[i]);
  auto invalid = cycle.initInvalidBits(static_cast<unsigned>(part.invalid_bits.size()));
  for (unsigned i = 0; i < invalid.size(); ++i) invalid.set(i, part.invalid_bits[i]);
  auto uncached = cycle.initUncached(static_cast<unsigned>(part.uncached.size()));
  for (unsigned i = 0; i < uncached.size(); ++i) {
    // This node's own proposals leave their ranks to it (Proposal::ranks).
    const Proposal& p = part.uncached[i];
    write_proposal(p, origin == me_ ? ranks_ : p.ranks, uncached[i]);
  }
  cycle.setAlphaSeconds(part.link.alpha_seconds);
  cycle.setBetaSecondsPerByte(part.link.beta_seconds_per_byte);
  cycle.setGammaSecondsPerByte(part.link.gamma_seconds_per_byte);
  const auto eager_count = static_cast<unsigned>(part.eager.entries.size());
  auto eager_bits = cycle.initEagerBits(eager_count);
  auto eager_sizes = cycle.initEagerSizes(eager_count);
  for (unsigned e = 0; e < eager_count; ++e) {
    eager_bits.set(e, part.eager.entries[e].bit);
    eager_sizes.set(e, static_cast<uint32_t>(part.eager.entries[e].size));
  }
  cycle.setEagerData(kj::arrayPtr(part.eager.bytes.data(), part.eager.bytes.size()));
  if (part.tuned) {
    auto tuned = cycle.initTuned();
    const TunedSettings& settings = part.tuned->settings;
    tuned.setFusionThresholdBytes(settings.fusion_threshold_bytes);
    tuned.setPieceBytes(settings.piece_bytes);
    tuned.setNegotiationHoldMicroseconds(settings.negotiation_hold_us);
    tuned.setRingMinBytes(settings.ring_min_bytes);
    tuned.setSearchDone(part.tuned->search_done);
  }
}

bool Negotiator::complete_cycle() {
  CycleState& state = cycle_state(cycle_);
  // What this node passes on goes before the cycle's parts are used up (apply).
  if (route_ == CycleRoute::kRelayed) relay(state);
  if (state.received < nodes_) return false;
  apply(state, rule_on_reports(state));
  cycles_.erase(cycle_);
  in_cycle_ = false;
  return true;
}

std::vector<Negotiator::Ruling> Negotiator::rule_on_reports(CycleState& state) {
  std::vector<Ruling> decisions;
  for (uint32_t node = 0; node < nodes_; ++node) {
    for (Proposal& p : state.from[node]->uncached) {
      auto& entries = reports_[p.key];
      // The first entry this node has not reported yet: every node reports a name's
      // instances in order.
      auto entry = std::find_if(entries.begin(), entries.end(),
                                [node](const Reports& e) { return !e.reported[node]; });
      if (entry == entries.end()) {
        entries.emplace_back(nodes_);
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
      if (p.piggybacks) {
        entry->contributions[node] = std::move(p.eager);
        ++entry->piggybacked;
      }
      while (!entries.empty() && entries.front().count == nodes_) {
        Reports& complete = entries.front();
        decisions.push_back({p.key, std::move(complete.mismatch),
                             complete.piggybacked == nodes_ ? std::move(complete.contributions)
                                                            : std::vector<std::vector<uint8_t>>{}});
        entries.pop_front();
      }
      if (entries.empty()) reports_.erase(p.key);
    }
  }
  return decisions;
}

void Negotiator::apply(CycleState& state, std::vector<Ruling> rulings) {
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
  agreed_eager_max_bytes_ = cost_model::eager_max_bytes(agreed_link_, nodes_);
  peer_ready_bits_.resize(nodes_);
  for (uint32_t node = 0; node < nodes_; ++node) {
    peer_ready_bits_[node] = state.from[node]->ready_bits;
  }
  CycleDecisions decided{cycle_, nodes_, agreed_link_, state.from[0]->tuned, {}, {}, {}};
  size_t ready_count = rulings.size();
  for (const uint64_t word : all_ready)
    ready_count += static_cast<size_t>(__builtin_popcountll(word));
  decided.decisions.reserve(ready_count);
  decided.contributions.reserve(ready_count * nodes_);
  std::vector<size_t> eager_cursors(nodes_, 0);  // bits come in ascending order, as entries do
  std::vector<const EagerSet::Entry*> eager(nodes_);
  for (size_t w = 0; w < all_ready.size(); ++w) {
    for (uint64_t word = all_ready[w]; word != 0; word &= word - 1) {
      const auto bit = static_cast<uint32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(word)));
      // Every node's bit, this one's too: this node proposed the name under it this cycle.
      if (cache_.key_of(bit) == nullptr || bit >= bit_names_.size() || bit_names_[bit] == kNoName) {
        throw std::invalid_argument(
            fmt::format("job '{}': cycle {} runs cache bit {}, which is free", job_, cycle_, bit));
      }
      cache_.touch(bit);
      ++counters_.cache_hits;
      const NameId id = bit_names_[bit];
      bit_names_[bit] = kNoName;
      Decision& decision = decided.decisions.emplace_back(
          Decision{id, {}, Decision::kNoContributions, take_front(id)});
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
  // Then the names every node has now reported, in the order of their last reports; agreed
  // ones join the cache, but for the client's names of unnamed ones. Each needed this node's
  // report, so each is this node's oldest instance of its name.
  for (Ruling& ruling : rulings) {
    const NameId id = ids_.at(ruling.key);
    PendingName& name = names_[id];
    const bool agreed = ruling.error.empty();
    if (agreed && cache_.capacity() > 0 && !ruling.key.starts_with(ipc::kUnnamedPrefix)) {
      cache_.put(ruling.key, name.instances.front().signature);
    }
    name.reported = false;
    --reported_count_;
    Decision& decision = decided.decisions.emplace_back(
        Decision{id, std::move(ruling.error), Decision::kNoContributions, take_front(id)});
    if (agreed && !ruling.contributions.empty()) {
      decision.contributions = decided.contributions.size();
      for (std::vector<uint8_t>& bytes : ruling.contributions) {
        // A vector moved keeps its storage: the span stays good.
        decided.contributions.emplace_back(bytes.data(), bytes.size());
        decided.eager_bytes.push_back(std::move(bytes));
      }
    }
  }
  if (!decided.decisions.empty()) decided_.push_back(std::move(decided));
  changed_ = true;
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
  } else if (const auto it = reports_.find(key); it != reports_.end()) {
    const Reports& oldest = it->second.front();
    for (uint32_t node = 0; node < nodes_; ++node) {
      if (node != me_ && !oldest.reported[node]) missing.push_back(node);
    }
  }
  return missing;
}

uint64_t Negotiator::take_front(NameId id) {
  PendingName& name = names_[id];
  Proposal taken = std::move(name.instances.front());
  name.instances.pop_front();
  if (taken.eager.capacity() > 0 && spare_eager_.size() < kMaxSpareEager) {
    taken.eager.clear();
    spare_eager_.push_back(std::move(taken.eager));
  }
  --pending_count_;
  if (name.instances.empty()) {
    // Out of active_: the last one takes its place.
    const NameId last = active_.back();
    active_[name.active_slot] = last;
    names_[last].active_slot = name.active_slot;
    active_.pop_back();
    name.active_slot = PendingName::kInactive;
  }
  return taken.cookie;
}

}  // namespace gradsync::daemon
