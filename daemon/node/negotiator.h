// Agreement among the node daemons of a job on which collectives run, in which order.
//
// Negotiation runs in cycles. A node starts cycle c when its state changed since its last
// cycle (a collective became ready here, or a decision made another one eligible), and joins
// it when a peer's message for c arrives; every node sends every other node one Cycle message:
//  - for each ready collective in the response cache, its bit (the AND over nodes runs it);
//  - for a cached name that is ready here with another signature, its bit as invalid (the OR
//    over nodes evicts it everywhere, and the collective is renegotiated);
//  - the ready collectives not in the cache, which node 0 (the coordinator) collects until
//    every node has reported them. In a cycle where any node had such a collective, node 0
//    answers with a CycleResponse: the ones complete now, in order, or a mismatch error.
// A cycle's decisions are its cached collectives by ascending bit, then the coordinator's, and
// every node applies them, and with them every change to the cache, in the same order: so the
// caches stay identical and a warm cache needs no coordinator round trip.
//
// Only the oldest ready instance of a name takes part (ranks may be a step ahead), so the
// instances of a name are decided in order. Pure logic over messages: the caller sends them.
#pragma once

#include "daemon/node/internode.capnp.h"
#include "daemon/node/response_cache.h"
#include "ipc/protocol.h"

#include <capnp/message.h>
#include <gradsync/gradsync.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace gradsync::daemon {

// Starts a message between node daemons: its root, with the job and the sending node set.
wire::NodeMessage::Builder start_node_message(capnp::MessageBuilder& message,
                                              const std::string& job, uint32_t node);

// A collective (or a group, named by its first member) that is ready on one node.
struct Proposal {
  std::string key;
  ipc::Collective collective = ipc::Collective::kBarrier;
  gradsync_dtype dtype = GRADSYNC_FLOAT32;
  gradsync_op op = GRADSYNC_SUM;
  uint64_t count = 0;
  uint32_t members = 1;
  int32_t root = -1;
  std::string ranks;  // the proposing node's ranks, in words, for error messages
  // For a small allreduce: this node's contribution, sent along with the cycle (see Cycle).
  std::vector<uint8_t> eager;

  // What the nodes must agree on, in words (mismatch errors quote it).
  std::string signature() const;
  // signature(), kept by the negotiator (it is compared in every cycle).
  std::string signature_text;
};

// Link figures of the α-β-γ cost model, as one node measured them.
struct LinkFigures {
  double alpha_seconds = 0;           // per message
  double beta_seconds_per_byte = 0;   // on the wire
  double gamma_seconds_per_byte = 0;  // to reduce
};

struct Decision {
  std::string key;
  std::string error;  // non-empty: fail it on every node
  // Every node's contribution, in node order, when all of them came with the cycle.
  std::vector<std::vector<uint8_t>> contributions;
};

// Contributions this large at most ride along with a cycle, and this much in all per message.
inline constexpr size_t kEagerMaxBytes = 4096;
inline constexpr size_t kEagerMaxTotalBytes = 256 << 10;
// At most this many uncached collectives per cycle message (the rest go in the next cycles),
// so that a cycle message stays well inside kNodeMessageLimitWords.
inline constexpr size_t kMaxUncachedPerCycle = 2048;
// What a node daemon reads of one message from another: above the largest cycle message
// (eager data, 2048 reports with names of up to 256 bytes, the bit vectors).
inline constexpr uint64_t kNodeMessageLimitWords = 2ull << 20;  // 16 MiB

class Negotiator {
 public:
  using SendFn = std::function<void(uint32_t node, capnp::MessageBuilder& message)>;

  Negotiator(std::string job, uint32_t nodes, uint32_t me, uint32_t cache_capacity,
             LinkFigures own_link, SendFn send);

  // A collective ready on this node. With `more_coming`, the caller has more ready right now:
  // the next cycle waits for them (one cycle for the lot instead of one for the first).
  void propose(Proposal proposal, bool more_coming = false);
  // Messages from node `node` (already checked to be another node of this job). Throw
  // std::invalid_argument for messages no correct peer sends.
  void on_cycle(uint32_t node, wire::Cycle::Reader cycle);
  void on_response(uint32_t node, wire::CycleResponse::Reader response);

  // Decided collectives in the order every node runs them; the caller pops them.
  std::deque<Decision>& decided() { return decided_; }

  // Every node's largest figures, as of the last cycle: the same on every node.
  const LinkFigures& agreed_link() const { return agreed_link_; }
  const ResponseCache& cache() const { return cache_; }

  struct Counters {
    uint64_t cache_hits = 0;    // decided through the bit vector
    uint64_t cache_misses = 0;  // reported to the coordinator
    uint64_t cycles = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  struct NodeCycle {
    std::vector<uint64_t> ready_bits;
    std::vector<uint64_t> invalid_bits;
    std::vector<Proposal> uncached;
    LinkFigures link;
    std::map<uint32_t, std::vector<uint8_t>> eager;  // by bit
  };
  struct CycleState {
    std::vector<std::optional<NodeCycle>> from;  // by node
    size_t received = 0;
    std::optional<std::vector<Decision>> response;
  };
  struct CoordinatorEntry {
    std::vector<bool> reported;  // by node
    size_t count = 0;
    std::string signature;  // of the first report, to compare the others with
    uint32_t first_node = 0;
    std::string first_ranks;
    std::string mismatch;
  };

  // Runs cycles for as long as there is something to do without waiting for a peer.
  void advance();
  bool start_cycle_if_due();
  bool complete_cycle();
  NodeCycle own_state() const;
  CycleState& cycle_state(uint64_t number);
  std::vector<Decision> coordinate(const CycleState& state);
  void apply(CycleState& state);  // moves the contributions out
  void pop_front(const std::string& key);

  std::string job_;
  uint32_t nodes_;
  uint32_t me_;
  LinkFigures own_link_;
  LinkFigures agreed_link_;
  SendFn send_;
  ResponseCache cache_;
  // By key, oldest first. Entries stay when empty (the same names come back every step) until
  // there are too many of them.
  std::map<std::string, std::deque<Proposal>> pending_;
  size_t pending_count_ = 0;        // proposals in pending_
  std::set<std::string> reported_;  // keys whose oldest instance went to the coordinator
  uint64_t cycle_ = 0;              // the last cycle this node took part in
  bool in_cycle_ = false;
  std::vector<uint64_t> last_ready_bits_;
  std::map<uint64_t, CycleState> cycles_;  // the current one and, at most, the next
  std::deque<Decision> decided_;
  Counters counters_;
  std::map<std::string, std::deque<CoordinatorEntry>> coordinator_;  // node 0 only
};

}  // namespace gradsync::daemon
