// One connected client, as the engine thread sees it. Created by the control thread at Hello,
// then owned by the engine; the control thread keeps only the socket.
#pragma once

#include "daemon/device/device_streams.h"
#include "ipc/segment.h"
#include "ipc/system.h"
#include "metrics/metrics.h"

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gradsync::daemon {

struct ClientIdentity {
  std::string job;
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t local_rank = 0;
  int32_t local_world_size = 1;
  pid_t pid = 0;
  uid_t uid = 0;
  std::vector<std::string> nodes;  // multi-node jobs: inter-node addresses in node order
  uint32_t node_rank = 0;
  std::string algorithm;                 // inter-node allreduce: auto, ring or rhd
  std::string wire_codec;                // what f32 allreduces send between nodes: none or bf16
  bool autotune = false;                 // the job's settings are tuned over its first steps
  std::vector<std::string> aggregators;  // multi-node jobs: HOST:PORT each (docs/aggregators.md)
  // The job this one is a part of (empty: none), and each rank's rank in it: a rank that job
  // loses to a fault fails this one too (Engine::lose_ranks).
  std::string parent_job;
  std::vector<int32_t> parent_ranks;
};

class Job;

class Session {
 public:
  Session(uint64_t id, ClientIdentity identity, ipc::Mapping segment, uint32_t ring_entries,
          ipc::UniqueFd doorbell, metrics::Metrics& metrics);
  ~Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  uint64_t id() const { return id_; }
  const ClientIdentity& identity() const { return identity_; }
  int doorbell_fd() const { return doorbell_.get(); }
  ipc::SegmentHeader& header() { return *view_.header; }

  // Pops the next submission if the completion ring has room for its completion, counting
  // the completions the client has not read yet: a client that stops reading stalls only
  // itself, and loses nothing.
  bool next_submission(ipc::SubmissionEntry& entry);
  bool has_submission() const { return submissions_.available() > 0 && has_completion_room(); }
  // Submissions wait for the client to read its completions (the engine then looks again now
  // and then: such a client may not ring the doorbell once it has read them).
  bool waits_for_completion_room() const {
    return submissions_.available() > 0 && !has_completion_room();
  }
  // Posts a completion; wake_if_owed() wakes the client if it sleeps. Message is truncated to
  // fit.
  void complete(uint64_t request, ipc::Collective collective, gradsync_result status,
                std::string_view message = {});
  // Wakes a sleeping client once for the completions posted since the last call. The engine
  // calls it once a round, after all of the round's completions: woken at the first of a
  // burst, a client that shares the daemon's core takes the core there and then (the
  // scheduler favours the woken), reads one completion, sleeps again, and so costs two
  // context switches per completion (161 tensors of a step took 0.55 ms instead of 0.16).
  void wake_if_owed();

  // The client's registered buffers, as ids: their mappings live in the engine's mapping
  // caches, keyed by (session, id). Host buffers with their registered bytes.
  void add_host_buffer(uint32_t id, uint64_t bytes) {
    remove_buffer(id);
    host_buffers_.emplace(id, bytes);
    registered_bytes_ += bytes;
  }
  void add_device_buffer(uint32_t id, uint64_t bytes) {
    remove_buffer(id);
    device_buffers_.emplace(id, bytes);
    registered_bytes_ += bytes;
  }
  // Whether it was registered (as either).
  bool remove_buffer(uint32_t id);
  bool is_device_buffer(uint32_t id) const { return device_buffers_.contains(id); }
  bool has_device_buffers() const { return !device_buffers_.empty(); }
  size_t host_buffer_count() const { return host_buffers_.size(); }
  size_t buffer_count() const { return host_buffers_.size() + device_buffers_.size(); }
  uint64_t registered_bytes() const { return registered_bytes_; }
  // The events of stream-ordered collectives (device_streams.h), once the client registers them.
  const std::shared_ptr<const ClientEvents>& events() const { return events_; }
  void set_events(std::shared_ptr<const ClientEvents> events) { events_ = std::move(events); }

  // For gradsyncctl: collectives taken from the ring, completions posted, and the difference.
  uint64_t submitted() const { return submitted_; }
  uint64_t completed() const { return completed_; }
  uint32_t in_flight() const { return in_flight_; }

  Job* job = nullptr;  // set when the engine attaches the session

 private:
  uint64_t id_;
  ClientIdentity identity_;
  ipc::Mapping segment_;
  ipc::SegmentView view_;
  ipc::RingConsumer<ipc::SubmissionEntry> submissions_;
  ipc::RingProducer<ipc::CompletionEntry> completions_;
  // Where a completion is put together: zeroed once, not per completion (only its used bytes
  // go on the ring, and a step brings a hundred of them).
  ipc::CompletionEntry completion_{};
  ipc::UniqueFd doorbell_;
  metrics::Metrics& metrics_;
  uint32_t in_flight_ = 0;  // popped submissions not yet completed
  bool wake_owed_ = false;  // completions posted since the client was last woken
  // Submissions that may still be taken before the completion ring's free slots are read
  // again: free slots less in_flight_, when last read. Taking one uses one; completing one
  // changes nothing (a slot fills as in_flight_ drops); the client reading one frees one.
  uint64_t take_budget_ = 0;
  bool has_completion_room() const {
    return take_budget_ > 0 || completions_.free_slots() > in_flight_;
  }
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  std::unordered_map<uint32_t, uint64_t> host_buffers_;  // id -> registered bytes
  std::unordered_map<uint32_t, uint64_t> device_buffers_;
  uint64_t registered_bytes_ = 0;
  std::shared_ptr<const ClientEvents> events_;
};

}  // namespace gradsync::daemon
