// Agreement among the node daemons of a job on which collectives run, in which order.
//
// Negotiation runs in cycles. A node starts cycle c when its state changed since its last
// cycle (a collective became ready here, or a decision made another one eligible), and joins
// it when a peer's message for c arrives; every node's part of the cycle reaches every node:
//  - for each ready collective in the response cache, its bit (the AND over nodes runs it);
//  - for a cached name that is ready here with another signature, its bit as invalid (the OR
//    over nodes evicts it everywhere, and the collective is renegotiated);
//  - the ready collectives not in the cache, reported. Every node keeps each name's reports
//    until every node has reported it, and then rules on it: it runs, or fails with a
//    mismatch error where the nodes' signatures differ.
// A cycle's decisions are its cached collectives by ascending bit, then the names whose last
// report came in it, in the order of the reports, and every node applies them, and with them
// every change to the cache, in the same order: so the caches and the reports kept stay
// identical, and nothing waits for a round trip to one node (as a coordinator's answer would):
// a collective is decided in the cycle in which the last node proposes it. A small one's data
// comes with its bit or its report alike.
//
// Names that begin with ipc::kUnnamedPrefix are never cached: the client names each unnamed
// collective so, and each such name is used once, so a cache entry would only lengthen every
// cycle's bit vectors and push out the names that come back every step.
//
// Only the oldest ready instance of a name takes part (ranks may be a step ahead), so the
// instances of a name are decided in order. Pure logic over messages: the caller sends them.
//
// Routes. Sent straight to every other node, a cycle takes one hop and costs every node n-1
// messages a cycle, which grows with the job. Relayed (recursive doubling, as an allreduce of
// the parts), it takes log2(p) hops among p = bit_floor(n) nodes, each node sending one message
// a hop with every part it knows so far; each of the n-p other nodes hands its part to a node
// of the p first and gets every other part back from it at the end (two hops more); it hears
// of a cycle another node started from that node only, which sends it its own part first. Every
// node ends with every node's part, as by the direct route, and decides alike.
//
// Holding a join. A node with nothing at all to propose that joins a peer's cycle at once
// makes that cycle decide nothing; its own proposal, a moment later, then needs a cycle of its
// own, and the nodes fall into a rhythm of two cycles per collective (the first node's ranks
// are always the first to get a result, so they are always the first to submit again). With
// `hold_empty_joins`, such a node holds back; it joins as soon as it has something to propose,
// or when the caller, after a bounded wait, calls release_hold().
#pragma once

#include "cost_model/cost_model.h"
#include "daemon/base/fifo.h"
#include "daemon/job/autotune.h"
#include "daemon/node/internode.capnp.h"
#include "daemon/node/response_cache.h"
#include "daemon/node/signature.h"
#include "ipc/protocol.h"

#include <capnp/message.h>
#include <gradsync/gradsync.h>

#include <bit>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gradsync::daemon {

// Starts a message between node daemons: its root, with the job and the sending node set.
wire::NodeMessage::Builder start_node_message(capnp::MessageBuilder& message,
                                              const std::string& job, uint32_t node);

// A collective (or a group, named by its first member) that is ready on one node.
struct Proposal {
  std::string key;
  Signature signature;
  // The proposing node's ranks, in words, for error messages; empty in this node's own
  // proposals (the negotiator knows its node's ranks).
  std::string ranks;
  // For a small collective: this node's contribution, sent along with the cycle (see Cycle),
  // where `piggybacks`. It may be empty: a broadcast's nodes other than its root's contribute
  // nothing, but say that they take it this way.
  bool piggybacks = false;
  std::vector<uint8_t> eager;
  // The proposer's handle for what it proposed, handed back in the Decision.
  uint64_t cookie = 0;
};

// A name as the negotiator knows it: Negotiator::name() gives it back.
using NameId = uint32_t;

struct Decision {
  NameId name = 0;
  std::string error;  // non-empty: fail it on every node
  // When every node's contribution came with the cycle: where they start in
  // CycleDecisions::contributions (one per node, in node order); otherwise kNoContributions.
  size_t contributions = kNoContributions;
  uint64_t cookie = 0;  // this node's Proposal's
  static constexpr size_t kNoContributions = SIZE_MAX;
};

// What one cycle decided, in the order every node runs it. A cycle's decisions are known
// together and on every node alike, so the caller may fuse them; different cycles must not
// be fused (a node may have applied the next one before another).
struct CycleDecisions {
  uint64_t cycle = 0;
  uint32_t nodes = 0;            // the job's: each decision with contributions has one per node
  cost_model::LinkFigures link;  // agreed as of this cycle, for choices every node must make alike
  // Node 0's tuned settings, in a job that autotunes: from this cycle on (autotune.h).
  std::optional<TuningAnnouncement> tuned;
  std::vector<Decision> decisions;
  std::vector<std::span<const uint8_t>> contributions;  // into eager_bytes
  // What the contributions point into: what piggybacked on the cycle's parts, one buffer per
  // node, and those that came with reports, one per node and name.
  std::vector<std::vector<uint8_t>> eager_bytes;

  // Every node's contribution to `decision`, in node order; empty when they did not all come.
  std::span<const std::span<const uint8_t>> contributions_of(const Decision& decision) const;
};

// Contributions of eager_max_bytes() at most (cost_model.h) piggyback on a cycle, and this much
// in all per message.
inline constexpr size_t kEagerMaxTotalBytes = 256 << 10;
// At most this many uncached collectives per cycle message (the rest go in the next cycles),
// so that a cycle message stays well inside kNodeMessageLimitWords.
inline constexpr size_t kMaxUncachedPerCycle = 2048;
// Relayed, a message carries up to n-1 nodes' parts: each node's part gets 1/(n-1) of both
// budgets (reports at least one), so that no message is larger than a part sent directly.
// What a node daemon reads of one message from another: above the largest cycle message
// (eager data, 2048 reports with names of up to 256 bytes, the bit vectors).
inline constexpr uint64_t kNodeMessageLimitWords = 2ull << 20;  // 16 MiB

// How a node's part of a cycle reaches the others (see above).
enum class CycleRoute {
  kDirect,   // to every other node: one hop, n-1 messages per node and cycle
  kRelayed,  // by recursive doubling: log2 n hops, about one message per node and hop
};

class Negotiator {
 public:
  using SendFn = std::function<void(uint32_t node, capnp::MessageBuilder& message)>;

  // `ranks`: this node's ranks in words ("ranks 2, 3"), for mismatch errors.
  Negotiator(std::string job, uint32_t nodes, uint32_t me, std::string ranks,
             uint32_t cache_capacity, cost_model::LinkFigures own_link, SendFn send,
             bool hold_empty_joins = false, CycleRoute route = CycleRoute::kDirect);

  // A collective ready on this node, named by proposal.key. With `more_coming`, the caller has
  // more ready right now: the next cycle waits for them (one cycle for the lot instead of one
  // for the first).
  void propose(Proposal proposal, bool more_coming = false);
  // The same, named by `key` (proposal.key is not read): no copy of a name seen before.
  void propose(std::string_view key, Proposal proposal, bool more_coming = false);
  // The key of a decided name; valid until the next propose.
  const std::string& name(NameId id) const { return names_[id].key; }
  // Storage for a Proposal's eager data, with the capacity of one decided before where there
  // is one: a small tensor's contribution is otherwise an allocation per tensor per step.
  std::vector<uint8_t> eager_storage();
  // Messages from node `node` (already checked to be another node of this job). Throw
  // std::invalid_argument for messages no correct peer sends.
  void on_cycle(uint32_t node, wire::Cycle::Reader cycle);
  // Node `node` passes on the parts it knows of one cycle (CycleRoute::kRelayed).
  void on_relay(uint32_t node, capnp::List<wire::RelayedCycle>::Reader parts);

  // A peer's cycle waits for this node, which holds back its (empty) part: see above.
  bool holding() const { return holding_; }
  // Joins the cycle this node holds back from, with what it has (nothing, or what came since).
  void release_hold();
  // Whether this node holds back empty joins from now on (autotune tunes the hold).
  void set_hold_empty_joins(bool hold) { hold_empty_joins_ = hold; }

  // Decided collectives, cycle by cycle, in the order every node runs them; the caller pops
  // them.
  std::deque<CycleDecisions>& decided() { return decided_; }
  bool has_decided() const { return !decided_.empty(); }

  // Node 0, in a job that autotunes: the settings its next cycles announce (CycleDecisions).
  void announce(const TuningAnnouncement& tuned) { announced_ = tuned; }

  // This node's figures, sent with its next cycles (a job refines them as it runs).
  void set_own_link(const cost_model::LinkFigures& link) { own_link_ = link; }
  // Every node's largest figures, as of the last cycle: the same on every node.
  const cost_model::LinkFigures& agreed_link() const { return agreed_link_; }
  // eager_max_bytes() (cost_model.h) of the agreed figures, worked out once a cycle; before
  // the first, the least it can be on every node alike (each node's own figures would have
  // the nodes decide differently whether a collective's data goes with its proposal).
  uint64_t agreed_eager_max_bytes() const { return agreed_eager_max_bytes_; }
  const ResponseCache& cache() const { return cache_; }

  struct Counters {
    uint64_t cache_hits = 0;    // decided through the bit vector
    uint64_t cache_misses = 0;  // reported, for every node to rule on
    uint64_t cycles = 0;
    uint64_t cycle_messages = 0;  // sent with parts of cycles
    bool operator==(const Counters&) const = default;
  };
  const Counters& counters() const { return counters_; }
  // By node: the last cycle heard from it (this node's own: the last it started).
  const std::vector<uint64_t>& last_cycles() const { return last_cycles_; }
  // The last cycle this node completed (its decisions are in decided(), or were popped).
  uint64_t completed_cycle() const { return in_cycle_ ? cycle_ - 1 : cycle_; }

  // The other nodes that, as far as this node can tell, have not proposed `key`'s oldest
  // instance: for a cached name, those whose last cycle did not have its bit; for a reported
  // name, those with no report of it yet.
  std::vector<uint32_t> nodes_without(const std::string& key) const;

 private:
  // Contributions that piggyback on one node's cycle message, in one buffer.
  struct EagerSet {
    struct Entry {
      uint32_t bit;
      size_t offset;
      size_t size;
    };
    std::vector<Entry> entries;  // by ascending bit
    std::vector<uint8_t> bytes;  // entries at multiples of kAlignment
    // Part of the wire format (Cycle.eagerData); the allocator's alignment at least.
    static constexpr size_t kAlignment = 16;
    static_assert(kAlignment >= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    static constexpr size_t aligned_offset(size_t size) {
      return (size + kAlignment - 1) & ~(kAlignment - 1);
    }

    void add(uint32_t bit, std::span<const uint8_t> data);
    // The entry of `bit`, if any, looking from `cursor` on (which it moves): ascending bits
    // take one pass over the entries.
    const Entry* seek(uint32_t bit, size_t& cursor) const;
  };
  struct NodeCycle {
    std::vector<uint64_t> ready_bits;
    std::vector<uint64_t> invalid_bits;
    std::vector<Proposal> uncached;
    std::vector<NameId> uncached_names;  // this node's own cycle only: uncached's names
    cost_model::LinkFigures link;
    EagerSet eager;
    std::optional<TuningAnnouncement> tuned;  // node 0's only
  };
  // What every node rules on a name every node has now reported.
  struct Ruling {
    std::string key;
    std::string error;  // non-empty: a mismatch
    // By node, the contributions that came with the reports; empty unless every node's came.
    std::vector<std::vector<uint8_t>> contributions;
  };
  struct CycleState {
    std::vector<std::optional<NodeCycle>> from;  // by node
    size_t received = 0;
    // CycleRoute::kRelayed: the hops this node has sent its parts on, and whether it told the
    // node past p that hands its part to it of the cycle (with its own part).
    uint32_t relays_sent = 0;
    bool told_handed_in = false;
  };
  // The reports of one instance of a name, until every node has made one.
  struct Reports {
    explicit Reports(uint32_t nodes) : reported(nodes), contributions(nodes) {}
    std::vector<bool> reported;  // by node
    size_t count = 0;
    Signature signature;  // of the first report, to compare the others with
    uint32_t first_node = 0;
    std::string first_ranks;
    std::string mismatch;
    std::vector<std::vector<uint8_t>> contributions;  // by node, where it came with the report
    uint32_t piggybacked = 0;                         // reports that brought one
  };
  // A name's instances ready on this node, oldest first (only the oldest takes part in a
  // cycle). Names are interned: a name's state is found by its id, without hashing the name
  // again on every step, and a name with no instance left stays for the next step until there
  // are too many idle ones.
  struct PendingName {
    std::string key;
    Fifo<Proposal> instances;
    // The name's cache bit as last looked up (kNoBit: not cached), valid while the cache is
    // at that generation: spares a lookup per name per cycle.
    mutable uint64_t cache_generation = UINT64_MAX;
    mutable uint32_t cache_bit = kNoBit;
    size_t active_slot = kInactive;  // where it is in active_, while it has instances
    bool reported = false;           // its oldest instance waits for every node's report
    // The name proposed after this one last time (kNoName: none yet): intern's guess.
    NameId proposed_next = kNoName;
    static constexpr uint32_t kNoBit = UINT32_MAX;
    static constexpr size_t kInactive = SIZE_MAX;
  };
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view key) const { return std::hash<std::string_view>{}(key); }
  };

  // The contributions that piggyback on a peer's cycle. Throws std::invalid_argument for a layout
  // no correct peer sends.
  void read_eager(wire::Cycle::Reader cycle, EagerSet& eager, uint32_t node, uint64_t number) const;
  // Node `node`'s part of a cycle (sent by it, or relayed by another). Throws
  // std::invalid_argument for a part no correct peer sends.
  void take_part(uint32_t node, wire::Cycle::Reader cycle);
  void write_part(uint32_t origin, const NodeCycle& part, uint64_t number,
                  wire::Cycle::Builder cycle) const;
  // Routes (negotiator_routes.cpp). Sends this node's part of the cycle it just started,
  // `own`, by the job's route.
  void send_own_part(CycleState& own);
  // CycleRoute::kRelayed: sends on what `state`'s cycle has ready to go (see Routes above).
  void relay(CycleState& state);
  // The parts of `state` from the nodes `include` names, to `to`, in one message.
  template <typename Include>
  void send_parts(uint32_t to, const CycleState& state, Include include);
  // Where node `node` sits among the p nodes that exchange: itself, or for one of the nodes
  // past them, the node it hands its part to.
  uint32_t relay_slot(uint32_t node) const {
    return node < relay_width_ ? node : node - relay_width_;
  }
  // Whether the relayed route brings node `origin`'s part to this node through node `sender`:
  // a node past p hands in its own part only, to its partner among the p first; that partner
  // gives it every other part; and hop h brings the sender's block of 2^h nodes.
  bool relays_through(uint32_t sender, uint32_t origin) const;
  // Runs cycles for as long as there is something to do without waiting for a peer.
  void advance();
  bool start_cycle_if_due();
  bool complete_cycle();
  NodeCycle own_state() const;
  CycleState& cycle_state(uint64_t number);
  // Adds the cycle's reports to those kept, and rules on the instances every node has now
  // reported, in the order of their last reports.
  // Moves the reports' contributions out of the cycle's parts.
  std::vector<Ruling> rule_on_reports(CycleState& state);
  // Applies the cycle's cached decisions, then `rulings`; moves the contributions out.
  void apply(CycleState& state, std::vector<Ruling> rulings);
  // The id of `key`, interned now if it is new. A step proposes its names in the same order
  // as the step before, so the name proposed after the last one then is nearly always the one
  // asked for: checking that guess compares the name once, where a lookup hashes it.
  NameId intern(std::string_view key);
  // Frees the ids of names with nothing pending, once there are too many of them.
  void sweep_idle_names();
  // Removes the oldest proposal of `name`, keeps its contribution's storage for the next
  // (eager_storage), and returns its cookie.
  uint64_t take_front(NameId name);

  std::string job_;
  std::vector<uint64_t> last_cycles_;
  uint32_t nodes_;
  uint32_t me_;
  std::string ranks_;
  cost_model::LinkFigures own_link_;
  cost_model::LinkFigures agreed_link_;
  std::optional<TuningAnnouncement> announced_;  // node 0's, when the job autotunes
  uint64_t agreed_eager_max_bytes_;
  SendFn send_;
  ResponseCache cache_;
  std::unordered_map<std::string, NameId, KeyHash, std::equal_to<>> ids_;
  std::vector<PendingName> names_;  // by id
  std::vector<NameId> free_ids_;
  std::vector<NameId> active_;  // the names with instances, in no particular order
  NameId last_interned_ = kNoName;
  size_t pending_count_ = 0;   // proposals in names_
  size_t reported_count_ = 0;  // names whose oldest instance is reported and not ruled on
  // By cache bit: the name this node last proposed under it (apply's lookup), written by
  // own_state.
  mutable std::vector<NameId> bit_names_;  // kNoName where it proposed none
  static constexpr NameId kNoName = UINT32_MAX;
  // own_state's scratch: by cache bit, the oldest instance's contribution to send along.
  mutable std::vector<const std::vector<uint8_t>*> eager_by_bit_;
  // Something was proposed or decided since start_cycle_if_due last found nothing to start.
  bool changed_ = true;
  std::vector<std::vector<uint8_t>> spare_eager_;
  static constexpr size_t kMaxSpareEager = 4096;
  uint64_t cycle_ = 0;  // the last cycle this node took part in
  bool in_cycle_ = false;
  bool hold_empty_joins_ = false;
  CycleRoute route_;
  uint32_t relay_width_;   // p: the largest power of two up to the node count
  uint32_t relay_levels_;  // log2(p)
  // What this node's part of a cycle holds at most: kMaxUncachedPerCycle reports and
  // kEagerMaxTotalBytes of contributions, shared among the parts a relayed message carries.
  size_t uncached_per_part_;
  size_t eager_bytes_per_part_;
  bool holding_ = false;
  bool hold_released_ = false;
  std::vector<uint64_t> last_ready_bits_;
  std::vector<std::vector<uint64_t>> peer_ready_bits_;  // by node, as of the last cycle
  std::map<uint64_t, CycleState> cycles_;               // the current one and, at most, the next
  std::deque<CycleDecisions> decided_;
  Counters counters_;
  // By name: the reports of its instances that not every node has made yet, oldest first.
  std::unordered_map<std::string, std::deque<Reports>> reports_;
};

}  // namespace gradsync::daemon
