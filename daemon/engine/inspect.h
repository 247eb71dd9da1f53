// What the engine tells an operator (gradsyncctl, through the control thread): a snapshot of
// its clients, jobs and peers, taken on the engine thread between two passes of its loop.
#pragma once

#include "daemon/aggregator/aggregator.h"
#include "daemon/job/autotune.h"
#include "daemon/job/trace.h"
#include "daemon/qos/policy.h"

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <vector>

namespace gradsync::daemon {

struct ClientView {
  uint64_t id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  std::string job;
  int32_t rank = 0;
  int32_t local_rank = 0;
  size_t buffers = 0;
  uint64_t submitted = 0;  // collectives taken from its ring
  uint64_t completed = 0;  // completions posted to it
  uint32_t in_flight = 0;  // taken and not completed
};

struct JobView {
  std::string name;
  // forming, measuring (its links, as a job across nodes forms), running, failed
  std::string state;
  std::string failure;
  int32_t local_world_size = 0;
  int32_t local_ranks = 0;  // connected now
  int32_t world_size = 0;
  std::vector<std::string> nodes;  // empty for a single-node job
  uint32_t node_rank = 0;
  std::string algorithm;   // across nodes: as asked for (auto, ring, rhd, direct, ...)
  std::string wire_codec;  // across nodes: none or bf16
  double stall_seconds = 0;
  std::string stall;  // what the oldest stall waits for, in words (empty: nothing waits)
  bool traced = false;
  // The job it is a part of (empty: none) and its ranks' ranks there; the ranks this job lost
  // (their connections ended without a goodbye), which fail its parts.
  std::string parent;
  std::vector<int32_t> parent_ranks;
  std::vector<int32_t> lost_ranks;
  // Its share of the node (docs/qos.md) and what it got of it.
  JobShare share;
  uint64_t engine_bytes = 0;
  uint64_t wire_bytes = 0;
  double wire_share = 0;  // of the node's bytes to other nodes, over the last second
  double share_wait_seconds = 0;
  // Autotune (docs/autotune.md): "searching", "done", "cut short" where this node tunes the
  // job; "searching on node 0", "done on node 0" on the other nodes of a job node 0 tunes;
  // empty: not tuned.
  std::string autotune;
  TunedSettings tuned;  // in effect, where autotune is not empty
  size_t autotune_trials = 0;
  double autotune_best_bus_bytes_per_second = 0;
};

struct PeerView {
  std::string address;
  bool failed = false;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t errors = 0;
  // As the last job that measured this link found it; zero before any did.
  double latency_seconds = 0;
  double bytes_per_second = 0;
};

struct EngineSnapshot {
  std::vector<ClientView> clients;
  std::vector<JobView> jobs;
  std::vector<PeerView> peers;
  std::vector<AggregatorJobView> aggregated_jobs;  // an aggregator's (docs/aggregators.md)
  size_t hidden_jobs = 0;                          // jobs of other users, left out for the viewer
  // What the wire pacer last measured the links to other nodes to carry (0: not yet).
  double link_bytes_per_second = 0;
};

// Engine commands for them.
struct InspectEngine {
  std::promise<EngineSnapshot> snapshot;
};
struct StartTrace {
  std::string job;
  uint32_t steps = 1;
  uint32_t max_events = 1;
  std::chrono::seconds timeout{60};
  std::promise<TraceData> result;  // TraceData::error says why none was recorded
};

}  // namespace gradsync::daemon
