// Every metric family the daemon exports, in one table: its name, type, labels and help. The
// registration (metrics.cpp) and the docs (docs/metrics.md, `gradsyncd --print-metrics-docs`)
// both come from it, and a unit test checks what a daemon exports against it.
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace gradsync::metrics {

enum class Family {
  kBuildInfo,
  kConfigInfo,
  kConnectedClients,
  kJobs,
  kCollectivesCompleted,
  kCollectiveDurationSeconds,
  kCollectivesFailed,
  kCollectiveBytes,
  kFusionBatchBytes,
  kFusionBatchTensors,
  kBatchDurationSeconds,
  kFusionBufferUseRatio,
  kSubmissionRingDepthEntries,
  kMappingCacheLookups,
  kMappingCacheReleased,
  kMappedBuffers,
  kMappedBytes,
  kTopkHeldBytes,
  kTopkEvictedTensors,
  kClientRequestsRejected,
  kPeerHandshakes,
  kStallSeconds,
  kPeerLatencySeconds,
  kPeerBandwidthBytesPerSecond,
  kPeerSentBytes,
  kPeerReceivedBytes,
  kPeerErrors,
  kStepBusBandwidthBytesPerSecond,
  kRankSubmittedSequence,
  kRankCompletedSequence,
  kNodeCycleSequence,
  kNegotiationCache,
  kNegotiationCycles,
  kNegotiationMessages,
  kInternodeAllreduces,
  kJobWeight,
  kJobCapBytesPerSecond,
  kJobEngineBytes,
  kJobWireBytes,
  kJobWireShare,
  kJobShareWaitSeconds,
  kJobScratchBytes,
  kLinkPacerRateBytesPerSecond,
  kAggregatorBytesReceived,
  kAggregatorBytesSent,
  kAggregatorChunksSummed,
  kAggregatorChunkWaitSeconds,
  kAggregatorPushesWaiting,
  kAggregationSentBytes,
  kAggregationReceivedBytes,
  kAutotuneTrials,  // autotune's families last: metrics.cpp registers them as a range
  kAutotuneDone,
  kAutotuneBestBusBandwidthBytesPerSecond,
  kAutotuneFusionThresholdBytes,
  kAutotunePieceBytes,
  kAutotuneNegotiationHoldSeconds,
  kAutotuneRingMinBytes,
  kCount
};

enum class Type { kCounter, kGauge, kHistogram };

struct FamilyDoc {
  Family family;
  const char* name;
  Type type;
  const char* labels;  // label names, separated by spaces; a histogram's `le` is implied
  const char* help;
};

inline constexpr std::array<FamilyDoc, static_cast<size_t>(Family::kCount)> kFamilies = {{
    {Family::kBuildInfo, "gradsync_build_info", Type::kGauge,
     "version cuda devices mps_devices reduce_isa", "Build of this gradsyncd"},
    {Family::kConfigInfo, "gradsync_config_info", Type::kGauge, "toml",
     "Effective configuration of this gradsyncd, as TOML"},
    {Family::kConnectedClients, "gradsync_connected_clients", Type::kGauge, "",
     "Client processes connected to this daemon"},
    {Family::kJobs, "gradsync_jobs", Type::kGauge, "state",
     "Jobs with at least one connected rank on this node, by state"},
    {Family::kCollectivesCompleted, "gradsync_collectives_completed_total", Type::kCounter,
     "op algorithm",
     "Collectives completed on this node (one per tensor, not per rank), by op and algorithm: "
     "local (one node), ring or rhd (allreduce across nodes), negotiation (data carried by the "
     "negotiation), direct (broadcast, allgather, reduce-scatter, all-to-all and a forced "
     "direct allreduce across nodes, sent from each node to every other), chain (broadcast along a "
     "pipelined chain of nodes), "
     "topk (allreduce across nodes through the top-k wire codec)"},
    {Family::kCollectiveDurationSeconds, "gradsync_collective_duration_seconds", Type::kHistogram,
     "op size",
     "Time from a collective being ready on this node (every local rank submitted it) to done, "
     "by op and size (payload bytes per rank)"},
    {Family::kCollectivesFailed, "gradsync_collectives_failed_total", Type::kCounter, "op",
     "Collective submissions completed with an error (per rank)"},
    {Family::kCollectiveBytes, "gradsync_collective_bytes_total", Type::kCounter, "op",
     "Payload bytes per rank of completed collectives"},
    {Family::kFusionBatchBytes, "gradsync_fusion_batch_bytes", Type::kHistogram, "",
     "Payload bytes per rank of each fused batch"},
    {Family::kFusionBatchTensors, "gradsync_fusion_batch_tensors", Type::kHistogram, "",
     "Tensors fused into each batch"},
    {Family::kBatchDurationSeconds, "gradsync_batch_duration_seconds", Type::kHistogram, "",
     "Time to execute one fused batch on the node"},
    {Family::kFusionBufferUseRatio, "gradsync_fusion_buffer_use_ratio", Type::kHistogram, "",
     "Bytes of each fused batch over the fusion threshold"},
    {Family::kSubmissionRingDepthEntries, "gradsync_submission_ring_depth_entries",
     Type::kHistogram, "",
     "Entries waiting on a client's submission ring when the engine drained it"},
    {Family::kMappingCacheLookups, "gradsync_mapping_cache_lookups_total", Type::kCounter, "result",
     "Registered client memory looked up for a submission (hit), mapped (miss: host memory is "
     "mapped when registered), or not registered"},
    {Family::kMappingCacheReleased, "gradsync_mapping_cache_released_total", Type::kCounter, "",
     "Mappings dropped because their client unregistered them or left"},
    {Family::kMappedBuffers, "gradsync_mapped_buffers", Type::kGauge, "",
     "Registered client buffers mapped in the daemon"},
    {Family::kMappedBytes, "gradsync_mapped_bytes", Type::kGauge, "",
     "Bytes of registered client buffers mapped in the daemon"},
    {Family::kTopkHeldBytes, "gradsync_topk_held_bytes", Type::kGauge, "",
     "What the top-k wire codec holds back for tensors' next allreduces, all jobs"},
    {Family::kTopkEvictedTensors, "gradsync_topk_evicted_tensors_total", Type::kCounter, "",
     "Tensor names whose held-back values the top-k codec dropped, least recently used past a "
     "job's bound"},
    {Family::kClientRequestsRejected, "gradsync_client_requests_rejected_total", Type::kCounter,
     "reason", "Control requests refused, by reason"},
    {Family::kPeerHandshakes, "gradsync_peer_handshakes_total", Type::kCounter, "result",
     "Cluster handshakes with other node daemons that ended, by result (refused: no key, another "
     "key, broken or too slow): one for each connection another daemon made to this one (two per "
     "daemon, bulk data and control), one for each daemon this one connected to"},
    {Family::kStallSeconds, "gradsync_stall_seconds", Type::kGauge, "training_job",
     "Age of the oldest tensor of a job that some of its ranks or nodes have submitted and "
     "others have not (0: none)"},
    {Family::kPeerLatencySeconds, "gradsync_peer_latency_seconds", Type::kGauge, "peer",
     "Per-message latency (alpha) to a peer node daemon, as measured when a job formed"},
    {Family::kPeerBandwidthBytesPerSecond, "gradsync_peer_bandwidth_bytes_per_second", Type::kGauge,
     "peer", "Bandwidth (1/beta) to a peer node daemon, as measured when a job formed"},
    {Family::kPeerSentBytes, "gradsync_peer_sent_bytes_total", Type::kCounter, "peer",
     "Bytes sent to a peer node daemon"},
    {Family::kPeerReceivedBytes, "gradsync_peer_received_bytes_total", Type::kCounter, "peer",
     "Bytes received from a peer node daemon"},
    {Family::kPeerErrors, "gradsync_peer_errors_total", Type::kCounter, "peer",
     "Failures of the connection to a peer node daemon, and sends refused because it had failed"},
    {Family::kStepBusBandwidthBytesPerSecond, "gradsync_step_bus_bandwidth_bytes_per_second",
     Type::kGauge, "training_job",
     "Bus bandwidth of a job's last whole step on this node, the nccl-tests way: bytes times the "
     "collective's bus factor (allreduce 2(n-1)/n) over the step's time from its first tensor "
     "ready to its last done"},
    {Family::kRankSubmittedSequence, "gradsync_rank_submitted_sequence", Type::kGauge,
     "training_job local_rank",
     "Collectives a job's local rank has submitted so far: the sequence number of its last"},
    {Family::kRankCompletedSequence, "gradsync_rank_completed_sequence", Type::kGauge,
     "training_job local_rank", "Collectives of a job's local rank completed so far"},
    {Family::kNodeCycleSequence, "gradsync_node_cycle_sequence", Type::kGauge, "training_job node",
     "The last negotiation cycle of a job heard from each of its nodes (this one's own "
     "included); the node behind is the one the others wait for"},
    {Family::kNegotiationCache, "gradsync_negotiation_cache_total", Type::kCounter, "result",
     "Collectives negotiated across nodes, by whether the response cache decided them (hit) or "
     "every node's report of them (miss)"},
    {Family::kNegotiationCycles, "gradsync_negotiation_cycles_total", Type::kCounter, "",
     "Negotiation cycles among node daemons"},
    {Family::kNegotiationMessages, "gradsync_negotiation_messages_total", Type::kCounter, "",
     "Messages with this node's parts of negotiation cycles (its own, and others' it relays) "
     "sent to other node daemons"},
    {Family::kInternodeAllreduces, "gradsync_internode_allreduces_total", Type::kCounter,
     "algorithm", "Allreduces run across nodes, by algorithm"},
    {Family::kJobWeight, "gradsync_job_weight", Type::kGauge, "training_job",
     "A job's share weight, from the first [[qos.rule]] that matches it (1: none does)"},
    {Family::kJobCapBytesPerSecond, "gradsync_job_cap_bytes_per_second", Type::kGauge,
     "training_job", "Cap on a job's sends to other node daemons (0: none)"},
    {Family::kJobEngineBytes, "gradsync_job_engine_bytes_total", Type::kCounter, "training_job",
     "Bytes of a single-node job's collectives the engine ran, per rank"},
    {Family::kJobWireBytes, "gradsync_job_wire_bytes_total", Type::kCounter, "training_job",
     "Bytes of a job's collectives sent to other node daemons"},
    {Family::kJobWireShare, "gradsync_job_wire_share", Type::kGauge, "training_job",
     "A job's part of this node's collective bytes to other node daemons over the last second "
     "(0 to 1)"},
    {Family::kJobShareWaitSeconds, "gradsync_job_share_wait_seconds_total", Type::kCounter,
     "training_job",
     "Time a job's ready work waited while other jobs were served (engine) or for its share of "
     "the links to other nodes"},
    {Family::kJobScratchBytes, "gradsync_job_scratch_bytes", Type::kGauge, "training_job",
     "Memory a job's collectives across nodes hold on this node for what they pack, receive and "
     "fuse: each keeps the most it was asked for until none has used it for "
     "scratch_unused_seconds"},
    {Family::kLinkPacerRateBytesPerSecond, "gradsync_link_pacer_rate_bytes_per_second",
     Type::kGauge, "",
     "What the pacer last measured this node's links to other nodes to carry (0: not yet); jobs "
     "sharing them are paced by it (docs/qos.md)"},
    {Family::kAggregatorBytesReceived, "gradsync_aggregator_received_bytes_total", Type::kCounter,
     "training_job", "On an aggregator: bytes of a job's chunks its nodes pushed"},
    {Family::kAggregatorBytesSent, "gradsync_aggregator_sent_bytes_total", Type::kCounter,
     "training_job", "On an aggregator: bytes of a job's sums sent back to its nodes"},
    {Family::kAggregatorChunksSummed, "gradsync_aggregator_chunks_summed_total", Type::kCounter,
     "training_job", "On an aggregator: a job's chunks summed over all its nodes"},
    {Family::kAggregatorChunkWaitSeconds, "gradsync_aggregator_chunk_wait_seconds",
     Type::kHistogram, "training_job",
     "On an aggregator: from a chunk's first push to its last (how far apart the job's nodes "
     "push)"},
    {Family::kAggregatorPushesWaiting, "gradsync_aggregator_pushes_waiting", Type::kGauge,
     "training_job",
     "On an aggregator: pushes of a job's announced collectives not arrived yet (its push "
     "queue's depth)"},
    {Family::kAggregationSentBytes, "gradsync_aggregation_sent_bytes_total", Type::kCounter,
     "aggregator", "Bytes this node's jobs pushed to each aggregator"},
    {Family::kAggregationReceivedBytes, "gradsync_aggregation_received_bytes_total", Type::kCounter,
     "aggregator", "Bytes of sums this node's jobs received from each aggregator"},
    {Family::kAutotuneTrials, "gradsync_autotune_trials", Type::kGauge, "training_job",
     "Trials an autotuned job's search has ended (a candidate's turn in a round), on the node "
     "that tunes it (node 0, or the job's only node)"},
    {Family::kAutotuneDone, "gradsync_autotune_done", Type::kGauge, "training_job",
     "1 once an autotuned job's search has ended and its choice is kept for the rest of the job"},
    {Family::kAutotuneBestBusBandwidthBytesPerSecond,
     "gradsync_autotune_best_bus_bandwidth_bytes_per_second", Type::kGauge, "training_job",
     "Step bus bandwidth of the best candidate measured so far (once done: of the one chosen)"},
    {Family::kAutotuneFusionThresholdBytes, "gradsync_autotune_fusion_threshold_bytes",
     Type::kGauge, "training_job", "An autotuned job's fusion threshold in effect"},
    {Family::kAutotunePieceBytes, "gradsync_autotune_piece_bytes", Type::kGauge, "training_job",
     "An autotuned job's pipeline piece in effect"},
    {Family::kAutotuneNegotiationHoldSeconds, "gradsync_autotune_negotiation_hold_seconds",
     Type::kGauge, "training_job", "An autotuned job's negotiation hold in effect (across nodes)"},
    {Family::kAutotuneRingMinBytes, "gradsync_autotune_ring_min_bytes", Type::kGauge,
     "training_job",
     "Across nodes: allreduces from this size take the ring, smaller ones halving-doubling (0: "
     "the cost model chooses)"},
}};

constexpr const FamilyDoc& family_doc(Family family) {
  return kFamilies[static_cast<size_t>(family)];
}

// Each entry sits at its own index: family_doc() looks it up by position.
constexpr bool families_in_order() {
  for (size_t i = 0; i < kFamilies.size(); ++i) {
    if (static_cast<size_t>(kFamilies[i].family) != i) return false;
  }
  return true;
}
static_assert(families_in_order(), "kFamilies must list the families in Family's order");

const char* type_name(Type type);  // "counter", "gauge", "histogram"

// docs/metrics.md's table of families.
std::string families_markdown();

}  // namespace gradsync::metrics
