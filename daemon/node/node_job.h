// A job's part across nodes. The node daemons of the job
//  1. join: each tells the others once all its local ranks have connected; when all have, the
//     job has formed across nodes, and each measures its links (link_probe.h);
//  2. negotiate, in cycles with a response cache, which collectives run in which order
//     (negotiator.h);
//  3. run each agreed collective: local reduce -> inter-node allreduce -> local broadcast,
//     fused into one pipelined pass (collectives/node_*.cpp), with the algorithm the cost
//     model picks (cost_model.h) unless the job forces one.
// Engine-thread only.
#pragma once

#include "cost_model/cost_model.h"
#include "daemon/collectives/internode/node_collectives.h"
#include "daemon/job/autotune.h"
#include "daemon/job/ready_unit.h"
#include "daemon/job/stall.h"
#include "daemon/job/step_meter.h"
#include "daemon/job/trace.h"
#include "daemon/job/unit_pool.h"
#include "daemon/links/aggregation.capnp.h"
#include "daemon/links/links.h"
#include "daemon/links/rank_map.h"
#include "daemon/node/internode.capnp.h"
#include "daemon/node/negotiator.h"
#include "daemon/qos/priority.h"
#include "metrics/metrics.h"

#include <capnp/message.h>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace gradsync::daemon {

// Node 0's cache capacity, algorithm, wire codec and fusion threshold hold for the whole job.
struct NodeJobSettings {
  std::chrono::seconds peer_timeout{60};
  uint32_t cache_capacity = 1024;
  std::string algorithm = "auto";  // "auto", "ring" or "rhd"
  cost_model::WireCodecSpec wire_codec;
  uint64_t fusion_threshold_bytes = 64ull << 20;
  uint64_t piece_bytes = cost_model::kPipelinePieceBytes;  // the ring's pipeline: node 0's
  // How long this node holds back an empty part of a peer's negotiation cycle (Negotiator,
  // "holding a join"); 0: joins at once. This node's own until node 0 tunes it (autotune.h).
  std::chrono::microseconds join_hold{0};
  // The longest hold the engine stays awake for (it spins no longer after work, and must not
  // sleep through a hold): a tuned hold stays within it.
  std::chrono::microseconds max_join_hold{0};
  // Where a link is slow (eager_bulk_pays), bulk data goes in messages of at most this many
  // bytes, which UCX sends without a rendezvous (transport::Mesh::largest_eager_message); 0:
  // never cut. Node 0's is agreed.
  uint64_t slow_link_message_bytes = 0;
  // Jobs of at least this many nodes relay their negotiation cycles (CycleRoute::kRelayed);
  // smaller ones send them to every node. Node 0's is agreed.
  uint32_t relay_min_nodes = 8;
  // Allreduces through aggregators go in chunks of at most this many bytes: node 0's.
  uint64_t aggregation_chunk_bytes = 64 << 10;
  // The aggregators' links for the cost model, in bytes per second (0: as the nodes' links).
  double aggregator_bytes_per_second = 0;
};

// Why a job cannot go on across nodes, and the status its ranks get.
struct NodeJobError {
  NodeJobError(std::string message) : message(std::move(message)) {}  // NOLINT: a peer's fault
  NodeJobError(gradsync_result status, std::string message)
      : status(status), message(std::move(message)) {}
  gradsync_result status = GRADSYNC_ERR_PEER_FAILED;
  std::string message;
};

class NodeJob {
 public:
  // `device_streams`: where collectives on device memory are staged (device_staging.h).
  NodeJob(const std::string& job_name, NodeLayout layout, transport::Transport& transport,
          NodeJobSettings settings, metrics::Metrics& metrics, DeviceStreams& device_streams);
  ~NodeJob();
  NodeJob(const NodeJob&) = delete;
  NodeJob& operator=(const NodeJob&) = delete;

  const NodeLayout& layout() const { return links_.layout(); }
  bool has_peer(transport::PeerId peer) const { return links_.has_peer(peer); }

  // Every local rank has connected (`ranks`: their job ranks): tell the other nodes.
  void on_local_formed(std::vector<int32_t> ranks);
  // Once every node (this one included) has joined and accepted this daemon's handshake:
  // starts measuring the links, and negotiating once that is done (run_decided drives it).
  // Does nothing before, while measuring, after it succeeded, or once the job failed; an error
  // if the nodes' settings or ranks do not fit together, or the measuring failed.
  std::optional<NodeJobError> form();
  // Every node has joined and the links are measured.
  bool formed() const { return negotiator_.has_value(); }
  // Node 0's once formed, this node's until then.
  const NodeJobSettings& settings() const { return formed() ? agreed_ : settings_; }
  // The nodes that have not joined, for the formation timeout's message.
  std::string missing_nodes() const;

  // A unit ready on this node; `more_coming`: more are ready right now (see Negotiator).
  void on_locally_ready(ReadyUnit unit, bool more_coming = false);
  // The message was meant for another instance of this job (internode.capnp, incarnation):
  // a join from a node that joined this one as another instance (its next job of this name),
  // or anything else that names another instance of this node's as its receiver.
  bool for_other_incarnation(wire::NodeMessage::Reader message) const;
  // A control message for this job from another node. Returns an error when the job cannot
  // go on (a peer broke the protocol, or the links could not be measured).
  std::optional<NodeJobError> on_message(wire::NodeMessage::Reader message);
  // Drives what the nodes have agreed on: completes what needs no network (mismatches, small
  // allreduces whose data came with the negotiation), starts the rest in the agreed order, a
  // few at a time, resumes what is in flight and completes it on every local rank. Never
  // waits. `ran`: whether anything moved. Returns an error message when the job cannot go on
  // (a peer failed or timed out); the ranks of the failed collective got it already.
  std::optional<std::string> run_decided(bool& ran);
  // Collectives started and not finished, or agreed and not started.
  bool busy() const { return !in_flight_.empty() || !queued_.empty(); }
  // Measuring the links as the job forms (see form).
  bool measuring() const { return probe_.has_value(); }

  // Another node failed the job: once what was agreed before is done here (the peer may have
  // done its part of it before it failed), the job fails with `reason`. What was agreed goes
  // up to the peer's `last_cycle`, which this node may not have completed yet.
  void abort_after_agreed(std::string reason, uint64_t last_cycle);
  // The reason, once the job should fail now: the agreed work is done, or has not finished
  // within the peer timeout of the abort.
  std::optional<std::string> abort_due() const;

  // The oldest collective ready here at least `min_age` that other nodes have not proposed,
  // named with its job and those nodes (as far as this node knows; see
  // Negotiator::nodes_without).
  std::optional<Stall> oldest_stall(std::chrono::steady_clock::time_point now,
                                    std::chrono::steady_clock::duration min_age) const;
  // Puts in `warn` each such collective waiting `warn_after` or more, once.
  void warn_stalls(std::chrono::steady_clock::time_point now,
                   std::chrono::steady_clock::duration warn_after, std::vector<std::string>& warn);

  // Tells every other node that the job failed here, and whether it gave up agreed
  // collectives (fail_waiting found some): see NodeMessage.abortAbandoned. And the job's
  // aggregators, which drop it.
  void broadcast_abort(const std::string& reason);
  // Tells every other node that ranks of the job here ended without leaving it (RanksLost).
  void broadcast_ranks_lost(std::span<const int32_t> ranks, const std::string& reason);
  // An aggregator of the job gave up on it (aggregation.capnp, error): an error naming it,
  // or nothing where the message was for another instance of the job.
  std::optional<std::string> on_aggregator_error(wire::AggregationMessage::Reader message) const;
  // Whether `peer` is one of the job's aggregators (rather than another node).
  bool is_aggregator(transport::PeerId peer) const {
    return links_.aggregator_index(peer).has_value();
  }
  // Checks that the job's connections still carry messages (see Mesh::check_alive).
  void check_peers_alive() { links_.check_alive(); }
  std::chrono::steady_clock::time_point created() const { return created_; }
  // Fails everything waiting here (the Job fails its own queues), and for good: a failed job
  // does not form.
  // Returns how many ranks' submissions it completed with the error.
  size_t fail_waiting(gradsync_result status, const std::string& message);

  // Counts a control message from another node in its peer's statistics.
  void count_received(uint64_t sender_tag, uint64_t bytes) {
    links_.count_received(sender_tag, bytes);
  }
  // Where the job's events go while it is traced (null: not traced), and where its completed
  // collectives count towards the step's bus bandwidth. The Job owns both.
  void set_trace(TraceRecorder* trace) { trace_ = trace; }
  void set_step_meter(StepMeter* steps) { steps_ = steps; }
  // Where completed units go for their storage to serve the next ones; the Job owns it.
  void set_unit_pool(UnitPool* pool) { unit_pool_ = pool; }

  uint16_t job_tag() const { return links_.job_tag(); }
  // Paces the job's bulk sends through the node's pacer, as `flow` (wire_pacer.h).
  void set_pacer(WirePacer* pacer, WirePacer::Flow flow) { links_.set_pacer(pacer, flow); }
  const Negotiator* negotiator() const { return negotiator_ ? &*negotiator_ : nullptr; }
  // The memory the job's collectives hold for what they pack, receive and fuse: the batches'
  // in flight and the spare ones', each slot the most it was asked for (and what measured the
  // links as the job formed).
  size_t scratch_bytes() const;
  // Frees what of it no collective has asked for since `unused_since`: in the spare ones, and
  // what measured the links once that is over. In flight, a batch keeps what it holds.
  void release_unused_scratch(std::chrono::steady_clock::time_point unused_since);

  // Node 0, in a job that autotunes: the settings every node applies from the next cycle on.
  void announce(const TuningAnnouncement& tuned);
  // The settings in effect: node 0's, as its last cycle that carried them announced (autotune.h),
  // else the job's agreed ones.
  const TunedSettings& tuned() const { return tuned_; }
  // What the last cycle that carried node 0's tuned settings said of its search, if one did.
  std::optional<bool> node_0_search_done() const { return node_0_search_done_; }

 private:
  void on_joined(uint32_t node, wire::Joined::Reader joined, uint64_t incarnation);
  // Tells each aggregator of the job that it has formed (join) or ended here (leave, with why
  // it failed, or "" for a job that ended well).
  void join_aggregators();
  void leave_aggregators(const std::string& reason);
  // Counts the bytes pushed to and received from each aggregator since the last call.
  void report_aggregation();
  // The aggregators as the cost model sees them (none where the job has none).
  cost_model::AggregatorFigures aggregator_figures(const cost_model::LinkFigures& link) const;
  // Sends a control message to `node`, stamped with this instance's incarnation and the one
  // `node` joined as.
  void send_control(uint32_t node, capnp::MessageBuilder& message);
  void stamp(uint32_t node, capnp::MessageBuilder& message) const;
  // Ends forming once the links are measured: starts negotiating. Nothing while the probe
  // runs; an error if it failed.
  std::optional<std::string> finish_forming();
  // Agreed collectives that run as one task: one unit, or several allreduces fused.
  struct Batch {
    std::vector<ReadyUnit> units;
    cost_model::LinkFigures link;  // as agreed in the cycle that decided them
    bool fused = false;
    AllreduceOperand::Layout layout = AllreduceOperand::Layout::kPacked;  // when fused
    int32_t priority = 0;                                                 // of every unit in it
    uint64_t order = 0;           // its first unit's place in the agreed order: its age
    uint64_t first_sequence = 0;  // the first of the job's collective numbers it takes
    TunedSettings tuned;          // as of the cycle that decided it
    // Alike on every node (priority.h).
    Ranked ranked() const { return {priority, priority_rank(priority, order)}; }
  };
  // A batch in progress, with everything its task refers to (at a stable address).
  struct InFlight {
    std::vector<ReadyUnit> units;
    cost_model::LinkFigures link;
    AllreduceOperand::Layout layout = AllreduceOperand::Layout::kPacked;
    uint64_t first_sequence = 0;
    Ranked ranked;                                    // its batch's
    TunedSettings tuned;                              // its batch's
    const char* allreduce_algorithm = "negotiation";  // for the metrics: set when one runs
    std::chrono::steady_clock::time_point started;    // for the trace, as are the times
    OperandTimes times;
    std::unique_ptr<Scratch> scratch;
    std::optional<NodeTask> task;  // last: it goes first, while what it refers to still exists
  };
  // At most this many batches of one job and priority are in flight: enough to keep the links
  // busy between collectives, few enough to bound the scratch memory. Each priority has its
  // own: a batch of higher priority starts while lower ones hold every slot, and as every node
  // starts each priority's batches in the agreed order, no node waits for a slot that another
  // node's batches hold. A batch does not start while one of another priority that ranks
  // higher is in flight (priority.h): starting costs the engine the first piece's work.
  static constexpr size_t kMaxInFlight = 4;
  // At most this many collectives in a batch fused in place: halving-doubling's message tags
  // count levels times blocks (collectives) in 16 bits.
  static constexpr size_t kMaxInPlaceMembers = 1024;

  void report_negotiation();
  // Records a finished batch's collectives in the trace.
  void trace_completed(const InFlight& work) const;
  // Counts a unit that completed well, at `now`, in the metrics and the step meter: by the
  // algorithm that ran it, or as piggybacking on the negotiation (`piggybacked`, whatever its
  // kind).
  void count_completed(const ReadyUnit& unit, const char* allreduce_algorithm, bool piggybacked,
                       const cost_model::LinkFigures& link,
                       std::chrono::steady_clock::time_point now);
  // Completes one cycle's decisions that need no network; queues the others as batches.
  std::optional<std::string> take_cycle(const CycleDecisions& cycle);
  // How `unit` may be fused, if it may: allreduces of one dtype and op within the fusion
  // threshold, either smaller than `cutoff` (cost_model.h: its copies in and out of a packed
  // batch cost less than a collective of its own), or large and carried by halving-doubling,
  // which moves a batch of large tensors in place as a message per tensor and level (the
  // ring's pieces would need a message per tensor and piece: large ones stay alone there).
  std::optional<AllreduceOperand::Layout> fusion_layout(const ReadyUnit& unit, uint64_t cutoff,
                                                        const cost_model::LinkFigures& link) const;
  // Resumes the tasks in flight, completes the finished, starts queued batches.
  std::optional<std::string> progress(bool& ran);
  // Numbers the batch's collectives (every node alike: in the agreed order) and queues it.
  void queue(Batch batch);
  void start(Batch batch);
  // With the codec the ring would apply to allreduces of `dtype`, and where the job tunes the
  // crossover, by `ring_min_bytes` (TunedSettings) rather than the cost model.
  cost_model::AllreduceAlgorithm choose(uint64_t bytes, gradsync_dtype dtype,
                                        const cost_model::LinkFigures& link,
                                        uint64_t ring_min_bytes) const;
  // Chain or direct, as the cost model or the job's forced algorithm (ring: chain; rhd:
  // direct) says.
  cost_model::BroadcastAlgorithm choose_broadcast_for(uint64_t bytes,
                                                      const cost_model::LinkFigures& link) const;
  // The step of a collective of `work`: bulk data cut into eager messages where the link its
  // cycle agreed on is slow.
  CollectiveContext step_for(InFlight& work, uint32_t sequence, gradsync_dtype dtype);
  cost_model::WireCodec codec_for(gradsync_dtype dtype) const;
  // The job's wire codec is top-k and `collective` (or a batch it leads) is an f32 sum or
  // average it applies to: on host memory, or on device memory staged whole. Agreed on every
  // node, as everything it looks at is.
  bool topk_applies(const ReadyCollective& collective) const;
  // The job's collective numbers `collective` takes (start()): one per staging piece; top-k's
  // two allreduces.
  uint64_t sequences_of(const ReadyCollective& collective) const;
  TopKRun topk_run(const InFlight& work);
  // Takes on the settings a cycle of node 0 announced.
  void apply_tuned(const TunedSettings& tuned);
  // Tells the metrics what residuals_ holds now, by the difference from the last call.
  void report_topk();
  // Learns from an allreduce that ran without error: a β lower than this node's (cost_model.h,
  // implied_beta) replaces it, in the next cycles and the metrics.
  void refine_beta(cost_model::AllreduceAlgorithm algorithm, uint64_t bytes,
                   cost_model::WireCodec codec, std::chrono::steady_clock::time_point started);
  // Exports this node's figures for its link to the left-hand node.
  void publish_own_link();
  NodeTask run_unit(InFlight& work);
  // One collective of a unit, on host memory (a device collective's staged copy), as collective
  // `sequence` of the job.
  // `topk`: through the top-k wire codec (topk_applies: not for a piece of a staged one).
  NodeTask run_collective(InFlight& work, const ReadyCollective& collective, uint32_t sequence,
                          bool topk);
  // One on device memory, staged through host memory (device_staging.h): in pieces, collectives
  // `sequence` on, where it is large.
  NodeTask run_staged(InFlight& work, const ReadyCollective& collective, uint32_t sequence);
  NodeTask run_fused(InFlight& work);
  // The allreduce from the contributions that came with the negotiation.
  NodeResult reduce_contributions(const ReadyCollective& collective,
                                  std::span<const std::span<const uint8_t>> contributions);

  NodeLinks links_;
  NodeJobSettings settings_;
  metrics::Metrics& metrics_;
  DeviceStreams& device_streams_;
  Negotiator::Counters reported_counters_;  // what metrics_ has been told
  std::optional<std::chrono::steady_clock::time_point> holding_since_;
  std::shared_ptr<spdlog::logger> log_;
  Scratch scratch_;  // for measuring the links
  bool local_formed_ = false;
  bool failed_ = false;       // the job failed (fail_waiting): it neither joins nor forms any more
  std::string ranks_;         // this node's, in words
  RankMap rank_nodes_;        // every node's ranks, as they joined
  std::vector<bool> joined_;  // by node
  uint64_t incarnation_;      // this node's instance of the job: random, not 0
  std::vector<uint64_t> peer_incarnations_;  // by node, as it joined; 0: not yet
  bool cutting_messages_ = false;            // the last step's bulk data went in eager messages
  bool aggregators_joined_ = false;          // told they serve the job, not told it ended
  std::vector<NodeLinks::AggregatorTraffic> reported_aggregation_;  // as the metrics were told
  NodeJobSettings agreed_;                                          // node 0's
  TunedSettings tuned_;                                             // in effect (tuned())
  std::optional<TunedSettings> from_node_0_;  // as its last cycle that carried them said
  std::optional<bool> node_0_search_done_;
  std::optional<TuningAnnouncement> announced_;  // node 0, autotuning: for the negotiator
  cost_model::LinkFigures own_link_;
  std::optional<Negotiator> negotiator_;
  std::vector<Proposal> unproposed_;  // ready before the job formed across nodes
  // Cycle messages that arrived before this node finished forming.
  std::vector<std::unique_ptr<capnp::MallocMessageBuilder>> early_;
  // Units proposed and not decided yet, by the cookie of their Proposal; slots are reused.
  std::vector<std::optional<ReadyUnit>> units_;
  std::vector<uint64_t> free_units_;
  struct UnitWait {
    std::chrono::steady_clock::time_point since;  // ready here
    bool warned = false;
  };
  std::vector<UnitWait> unit_waits_;  // by cookie, as units_
  std::string stall_message(const ReadyUnit& unit,
                            std::chrono::steady_clock::duration waited) const;
  // What the top-k codec held back, by tensor name; before in_flight_, whose tasks use it.
  Residuals residuals_;
  uint64_t reported_held_bytes_ = 0;  // residuals_'s, as the metrics were last told
  uint64_t reported_evicted_ = 0;
  // Agreed, not started: by priority, the highest first; each priority's in the agreed order.
  std::map<int32_t, std::deque<Batch>, std::greater<>> queued_;
  std::list<std::unique_ptr<InFlight>> in_flight_;
  std::vector<std::unique_ptr<Scratch>> spare_scratch_;
  uint64_t next_sequence_ = 0;
  uint64_t queued_units_ = 0;  // agreed units queued, ever
  std::optional<std::string> abort_reason_;
  bool abandoned_ = false;  // agreed collectives were unfinished when the job failed here
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point abort_deadline_;
  uint64_t abort_after_cycle_ = 0;                // the aborting peer's last completed cycle
  std::vector<const void*> contribution_inputs_;  // reduce_contributions' scratch
  TraceRecorder* trace_ = nullptr;
  StepMeter* steps_ = nullptr;
  UnitPool* unit_pool_ = nullptr;
  // Measuring the links while the job forms; after scratch_ and own_link_, which it writes, so
  // that it goes first.
  std::optional<NodeTask> probe_;
  void recycle(ReadyUnit&& unit) {
    if (unit_pool_ != nullptr) unit_pool_->recycle(std::move(unit));
  }
};

}  // namespace gradsync::daemon
