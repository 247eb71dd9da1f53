// A job's connections to its other node daemons, as its collectives use them: tagged sends
// and receives over the transport (the UCX mesh, or in tests an in-process one), and a bounded wait
// that turns a dead or silent peer into an error instead of a hang.
#pragma once

#include "daemon/links/node_task.h"
#include "daemon/qos/priority.h"
#include "daemon/qos/wire_pacer.h"

#include "transport/transport.h"

#include <capnp/message.h>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradsync::daemon {

// Tag layout between node daemons: kind (8 bits) | sender node (8) | job (16) | low 32 bits.
namespace tags {
inline constexpr uint64_t kControl = 1;
inline constexpr uint64_t kData = 2;
inline constexpr uint64_t kProbe = 3;
// Between a job's nodes and its aggregators (aggregation.capnp, aggregation_plan.h): control
// messages, a node's chunks pushed to an aggregator, and the sums it sends back. The node
// field of a push names the sending node, of a sum the aggregator's place in the job's list.
inline constexpr uint64_t kAggregation = 4;
inline constexpr uint64_t kPush = 5;
inline constexpr uint64_t kSum = 6;
inline constexpr uint64_t kKindMask = uint64_t{0xff} << 56;
inline constexpr uint64_t kNodeMask = uint64_t{0xff} << 48;
inline constexpr uint64_t kJobMask = uint64_t{0xffff} << 32;
inline constexpr uint64_t kAll = ~uint64_t{0};
inline uint64_t make(uint64_t kind, uint32_t node, uint16_t job, uint32_t low) {
  return (kind << 56) | (uint64_t{node & 0xffu} << 48) | (uint64_t{job} << 32) | low;
}
// The job field: the job's name hashed.
inline uint16_t job_of_name(std::string_view name) {
  return static_cast<uint16_t>(std::hash<std::string_view>{}(name));
}
// The low 32 bits of a collective's messages: its number in the job's agreed order (16 bits)
// and the message's part of it.
inline uint32_t low(uint32_t sequence, uint64_t part) {
  return ((sequence & 0xffffu) << 16) | static_cast<uint32_t>(part & 0xffffu);
}
inline uint32_t node_of(uint64_t tag) {
  return static_cast<uint32_t>((tag & kNodeMask) >> 48);
}
inline uint16_t job_of(uint64_t tag) {
  return static_cast<uint16_t>((tag & kJobMask) >> 32);
}
}  // namespace tags

inline constexpr uint32_t kMaxNodes = 255;

struct NodeLayout {
  std::vector<std::string> nodes;  // inter-node addresses, in node order
  uint32_t node_rank = 0;
  int32_t world_size = 1;  // ranks of the job on all nodes
  // The aggregators the job may sum through (docs/aggregators.md), HOST:PORT; none: it runs
  // among its nodes alone.
  std::vector<std::string> aggregators;
};

// Host memory the collectives stage through. Shared so that a collective given up on can hand
// it to the transport while UCX may still write into it; the job then starts afresh.
class Scratch {
 public:
  uint8_t* get(size_t slot, size_t bytes);
  std::vector<std::shared_ptr<const void>> abandon();
  // The memory held, every slot's: each keeps the most it was asked for.
  size_t bytes() const;
  // Frees each slot not asked for since `unused_since` (the next get allocates it afresh);
  // returns the bytes freed. Only for a Scratch that nothing runs on: a collective keeps what
  // get returned for as long as it runs.
  size_t release_unused(std::chrono::steady_clock::time_point unused_since);

 private:
  struct Slot {
    std::shared_ptr<std::vector<uint8_t>> buffer;
    std::chrono::steady_clock::time_point asked{};
  };
  std::vector<Slot> slots_;
};

class NodeLinks {
 public:
  NodeLinks(const std::string& job_name, NodeLayout layout, transport::Transport& transport,
            std::chrono::seconds peer_timeout);

  const std::string& job_name() const { return job_name_; }
  const NodeLayout& layout() const { return layout_; }
  uint32_t nodes() const { return static_cast<uint32_t>(layout_.nodes.size()); }
  uint32_t me() const { return layout_.node_rank; }
  uint32_t aggregators() const { return static_cast<uint32_t>(aggregator_peers_.size()); }
  // Another node of the job, or one of its aggregators.
  bool has_peer(transport::PeerId peer) const;
  transport::PeerId aggregator_peer(uint32_t a) const { return aggregator_peers_[a]; }
  // The aggregator `peer` is, in the job's list; nullopt: it is none of them.
  std::optional<uint32_t> aggregator_index(transport::PeerId peer) const;
  // Every other node, and every aggregator, has accepted this daemon's handshake: data may
  // flow.
  bool authenticated() const;
  // Has the transport check that every other node still answers (after a failure: a connection
  // that does not is closed, and the next job reconnects).
  void check_alive();
  std::chrono::seconds peer_timeout() const { return peer_timeout_; }
  uint16_t job_tag() const { return job_tag_; }  // the job's name, hashed, in every tag
  // This node's instance of the job (internode.capnp, incarnation): in every message to an
  // aggregator.
  uint64_t incarnation() const { return incarnation_; }
  void set_incarnation(uint64_t incarnation) { incarnation_ = incarnation; }

  // Tag of a message from `sender`; `sequence` keeps collectives apart (a few at a time are in
  // flight, numbered in the agreed order, so 16 bits are plenty: a collective would have to
  // stay in flight while 65536 others of higher priority ran), `part` the messages of one.
  uint64_t tag(uint64_t kind, uint32_t sender, uint32_t sequence, uint32_t part) const;

  // `max_message_bytes`: see transport::Transport::send (0: one message).
  transport::Operation send(uint32_t node, uint64_t tag, const void* data, size_t bytes,
                            size_t max_message_bytes = 0);
  // From `sender` exactly, or from any node when sender is nullopt (a tag only one node sends).
  transport::Operation receive(uint64_t tag, std::optional<uint32_t> sender, void* data,
                               size_t bytes, size_t max_message_bytes = 0);

  // Counts what a message with `sender_tag` brought in its sender's statistics.
  void count_received(uint64_t sender_tag, uint64_t bytes);
  // Through aggregator `a` (aggregation_plan.h): this node's push of chunk `local` of
  // collective `sequence`, and the receive of its sum. Counted in aggregator_traffic().
  transport::Operation push(uint32_t a, uint32_t sequence, uint64_t local, const void* data,
                            size_t bytes);
  transport::Operation receive_sum(uint32_t a, uint32_t sequence, uint64_t local, void* data,
                                   size_t bytes);
  // A control message to aggregator `a`, sent without waiting (as send_control).
  void send_to_aggregator(uint32_t a, capnp::MessageBuilder& message);
  // Bytes pushed to and sums asked of each aggregator, in the job's order.
  struct AggregatorTraffic {
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
  };
  const std::vector<AggregatorTraffic>& aggregator_traffic() const { return aggregator_traffic_; }

  // Records a measured link to `node` in its peer's statistics.
  void set_link(uint32_t node, double latency_seconds, double bytes_per_second);

  // The node's pacer of inter-node sends, and this job's flow in it (null: not paced).
  void set_pacer(WirePacer* pacer, WirePacer::Flow flow) {
    pacer_ = pacer;
    flow_ = flow;
  }
  WirePacer* pacer() const { return pacer_; }
  WirePacer::Flow flow() const { return flow_; }
  // Tells the pacer the job has a collective on the node (WirePacer::note_collective).
  void note_collective() {
    if (pacer_ != nullptr) pacer_->note_collective(flow_, std::chrono::steady_clock::now());
  }
  // The highest-ranked of the job's collectives in flight (PaceWait); none: nothing in flight.
  void set_top(std::optional<Ranked> top) { top_ = top; }
  const std::optional<Ranked>& top() const { return top_; }

  // Drives UCX; true when it made progress.
  bool progress() { return transport_.progress(); }
  // An error naming the first other node of the job that failed, if any.
  std::optional<std::string> failed_peer(const char* what) const;
  transport::Transport& transport() { return transport_; }

  // A control message to one node, sent without waiting (the transport holds it until it is out);
  // or to every live node, waiting a bounded time (for aborts, before the job goes), with
  // `address` called before each node's copy is encoded.
  void send_control(uint32_t node, capnp::MessageBuilder& message);
  void send_control_to_all_live(capnp::MessageBuilder& message,
                                const std::function<void(uint32_t node)>& address);

 private:
  std::string job_name_;
  NodeLayout layout_;
  transport::Transport& transport_;
  std::chrono::seconds peer_timeout_;
  uint16_t job_tag_;
  uint64_t incarnation_ = 0;
  std::vector<transport::PeerId> peers_;  // by node; own entry unused
  std::vector<transport::PeerId> aggregator_peers_;
  std::vector<AggregatorTraffic> aggregator_traffic_;
  WirePacer* pacer_ = nullptr;
  WirePacer::Flow flow_ = 0;
  std::optional<Ranked> top_;
};

// Waits until the node's pacer lets the job send `bytes` (wire_pacer.h); at once where the job
// is not paced. A collective waits so before each of its bulk sends, once the receives of the
// same step are posted: a peer's sends never wait for this node's pacer to post theirs.
// And while the job's highest-ranked collective in flight holds it back (priority.h), it
// waits for that one to finish, so that the other's sends queue behind the few pieces it had
// already handed to the transport (docs/priority.md). This never stops the job: the highest-ranked
// collective in flight anywhere waits for none, on every node (the nodes rank alike, and start each
// priority's collectives in the same order), and a waiting one's rank rises as others are queued.
class PaceWait final : public NodeWait {
 public:
  PaceWait(NodeLinks& links, uint64_t bytes, Ranked ranked)
      : links_(&links), bytes_(bytes), ranked_(ranked) {}
  PaceWait(PaceWait&& other) noexcept
      : links_(other.links_),
        bytes_(other.bytes_),
        ranked_(other.ranked_),
        ticket_(std::exchange(other.ticket_, 0)) {}
  PaceWait& operator=(PaceWait&&) = delete;
  PaceWait(const PaceWait&) = delete;
  PaceWait& operator=(const PaceWait&) = delete;
  ~PaceWait() override;
  bool ready() override;
  NodeResult take_result() { return std::nullopt; }

 private:
  NodeLinks* links_;
  uint64_t bytes_;
  Ranked ranked_;
  WirePacer::Ticket ticket_ = 0;  // while waiting for the grant
};

class Flight;

// A wait on one operation of a Flight, or on all of them (see Flight::wait).
class FlightWait final : public NodeWait {
 public:
  FlightWait(Flight& flight, std::optional<size_t> index);
  bool ready() override;
  NodeResult take_result() { return std::move(result_); }

 private:
  Flight* flight_;
  std::optional<size_t> index_;  // nullopt: every operation
  NodeResult result_;
  std::chrono::steady_clock::time_point deadline_;
  size_t done_at_deadline_ = 0;  // operations done when the deadline was last set
};

// The operations of one collective in flight, waited on one by one or all together. Whatever
// is still pending when the Flight goes (the collective failed, or returned early) is retired
// to the transport with the memory it may touch (`memory`, and the scratch buffers, which the job
// then replaces): UCX may still write into a receive's buffer after it was given up on.
class Flight {
 public:
  Flight(NodeLinks& links, Scratch* scratch, std::vector<std::shared_ptr<const void>> memory,
         const char* what);
  ~Flight();
  Flight(const Flight&) = delete;
  Flight& operator=(const Flight&) = delete;

  size_t add(transport::Operation operation);
  // co_await in a NodeTask: until operation `index` is done, or every operation. The result is
  // an error message when a peer failed, an operation failed, or none of the Flight's
  // operations completed for the peer timeout.
  NodeAwait<FlightWait> wait(size_t index) { return {FlightWait(*this, index)}; }
  NodeAwait<FlightWait> wait_all() { return {FlightWait(*this, std::nullopt)}; }

 private:
  friend class FlightWait;
  std::optional<std::string> failure_of(const transport::Operation& operation) const;
  size_t count_done() const;

  NodeLinks& links_;
  Scratch* scratch_;
  std::vector<std::shared_ptr<const void>> memory_;
  const char* what_;
  std::deque<transport::Operation> operations_;  // stable while more are added
  size_t waited_ = 0;                            // operations_[0, waited_) are known to be done
};

}  // namespace gradsync::daemon
