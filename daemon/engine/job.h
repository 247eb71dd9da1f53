// A job's ranks on this node and the negotiation among them: which tensors every local rank
// has submitted, in which order they run, and which fail. Engine-thread only.
#pragma once

#include "daemon/base/fifo.h"
#include "daemon/job/autotune.h"
#include "daemon/job/ready_unit.h"
#include "daemon/job/stall.h"
#include "daemon/job/step_meter.h"
#include "daemon/job/submission.h"
#include "daemon/job/trace.h"
#include "daemon/job/unit_pool.h"
#include "daemon/qos/policy.h"

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gradsync::daemon {

class NodeJob;

class Job {
 public:
  using Clock = std::chrono::steady_clock;

  Job(std::string name, int32_t local_world_size, Clock::time_point formation_deadline);
  ~Job();

  // The job's part across nodes; null for a single-node job.
  NodeJob* network() const { return network_.get(); }
  void set_network(std::unique_ptr<NodeJob> network);

  const std::string& name() const { return name_; }
  int32_t local_world_size() const { return local_world_size_; }
  int32_t world_size() const;  // on every node
  const std::optional<std::string>& failure() const { return failure_; }

  void attach(Session& session);
  // Detaches and fails the job: the others' collectives cannot complete without this rank.
  void detach(Session& session, const std::string& reason);
  bool empty() const;
  // The job ranks of the local ranks connected now.
  std::vector<int32_t> ranks() const;
  int32_t connected_ranks() const;
  // Collectives each local rank has submitted and had completed (0 for a rank not connected).
  void rank_progress(std::vector<uint64_t>& submitted, std::vector<uint64_t>& completed) const;
  StepMeter& steps() { return steps_; }
  UnitPool& unit_pool() { return unit_pool_; }
  // Every local rank has connected at some point.
  bool locally_formed() const { return formed_; }
  // And, across nodes, every node has joined.
  bool formed() const;
  Clock::time_point formation_deadline() const { return formation_deadline_; }
  // Fails the job if it has not formed (on every node) by its deadline; true if it did so now.
  bool check_formation(Clock::time_point now);

  // The job this one is a part of (gradsync_job_settings.parent_job; job empty: none), and
  // each rank's rank in it: a rank lost there is lost here too (Engine::lose_ranks).
  struct Parent {
    std::string job;
    std::vector<int32_t> ranks;  // by this job's rank
  };
  const Parent& parent() const { return parent_; }
  void set_parent(Parent parent) { parent_ = std::move(parent); }
  // The ranks (of this job, on any node) whose connection ended without leaving it, with why:
  // a part of this job that forms here later and holds one fails at once.
  const std::map<int32_t, std::string>& lost_ranks() const { return lost_ranks_; }
  void add_lost_rank(int32_t rank, const std::string& reason) { lost_ranks_.emplace(rank, reason); }

  // Takes one rank's submission, taken off its ring at `taken_at`. Completes it at once with an
  // error if the job has failed.
  void submit(Submission submission, Clock::time_point taken_at);

  // Fails everything pending and everything submitted from now on. Returns how many ranks'
  // submissions were pending (0: the job had nothing in flight here).
  size_t fail(gradsync_result status, const std::string& message);

  // Ready units in the order they became ready (the same order on every rank).
  std::deque<ReadyUnit>& ready() { return ready_; }

  // The recording of this job's events, while `gradsyncctl trace` asks for one (else null).
  TraceRecorder* trace() const {
    return trace_ != nullptr && !trace_->finished() ? trace_.get() : nullptr;
  }
  // Starts a recording; trace() must be null (one that has finished may still be held here
  // until check_trace: it goes now).
  void start_trace(std::unique_ptr<TraceRecorder> recorder);
  // Drops the recording once it has ended (at its deadline, if not before).
  void check_trace(Clock::time_point now);

  // The oldest tensor some local ranks submitted at least `min_age` ago and others have not,
  // if any.
  std::optional<Stall> oldest_stall(Clock::time_point now, Clock::duration min_age) const;
  // Puts in `warn` each such tensor waiting `warn_after` or more, once.
  void warn_stalls(Clock::time_point now, Clock::duration warn_after,
                   std::vector<std::string>& warn);
  // Its share of the node (docs/qos.md), and what it got of it.
  struct Qos {
    uint64_t flow = 0;  // in the engine's and the pacer's fair order; 0: not placed yet
    uid_t owner = 0;    // the user of its first rank here
    JobShare share;
    uint64_t engine_bytes = 0;         // of its single-node collectives run, per rank
    double engine_wait_seconds = 0;    // its host work ready while another job's ran
    uint64_t reported_wire_bytes = 0;  // the pacer's count at the last sample
    double wire_share = 0;             // its part of the node's paced bytes in the last interval
  };
  Qos& qos() { return qos_; }
  const Qos& qos() const { return qos_; }

  // Autotune (autotune.h). A single-node job runs with what its Autotuner says; across nodes,
  // node 0's Job announces it through its NodeJob, and every node's NodeJob applies it.
  void start_autotune(const TunedSettings& start, const AutotuneLimits& limits,
                      Clock::time_point now);
  const Autotuner* autotuner() const { return autotuner_ ? &*autotuner_ : nullptr; }
  // The settings in effect, where autotune sets them (else null: the daemon's configuration).
  const TunedSettings* tuned() const;
  // The trials that ended since the last call, and once the search is done, the choice (a
  // trial of no steps), for the engine's log.
  std::vector<AutotuneTrial> take_autotune_events();

  // The age of the job's oldest stall as last inspected (engine_inspect.cpp), for the metrics.
  double stall_seconds() const { return stall_seconds_; }
  void set_stall_seconds(double seconds) { stall_seconds_ = seconds; }

 private:
  // Negotiation entries kept between steps before idle ones are swept.
  static constexpr size_t kMaxIdleTensors = 1 << 16;

  struct PendingTensor {
    std::vector<Fifo<Submission>> per_rank;
    size_t ranks_waiting;               // ranks with an empty queue
    Clock::time_point since{};          // when its oldest instance was first submitted
    bool warned = false;                // about the stall of that instance
    const std::string* name = nullptr;  // its key in pending_
    // The tensor a rank submitted after this one last time: find_pending's guess.
    PendingTensor* submitted_next = nullptr;

    // Some ranks have submitted it and others have not: what a stall is.
    bool partly_submitted() const { return ranks_waiting != 0 && ranks_waiting != per_rank.size(); }
  };
  // The entry of `name`, made now if it is new. A rank submits a step's tensors in the order
  // of the step before, so the tensor it submitted after its last one then is nearly always
  // the one asked for: checking that guess compares the name once, where a lookup hashes it.
  PendingTensor& find_pending(size_t rank, const std::string& name);
  // Drops the guesses, before entries of pending_ are erased.
  void forget_submission_order();
  std::string stall_message(const std::string& name, const PendingTensor& tensor,
                            Clock::duration waited) const;

  // Gives the Autotuner the step that ended at `now`.
  void tune(const StepMeter::Step& step, Clock::time_point now);
  // `since`: when the first of them submitted it; `ready`: when the last did.
  void on_all_submitted(std::vector<Submission> ranks, Clock::time_point since,
                        Clock::time_point ready);
  // Returns how many submissions it failed.
  size_t fail_collective(std::vector<Submission>& ranks, gradsync_result status,
                         const std::string& message);

  std::string name_;
  int32_t local_world_size_;
  std::vector<Session*> sessions_;  // by local rank
  bool formed_ = false;
  Clock::time_point formation_deadline_;
  std::optional<std::string> failure_;
  gradsync_result failure_status_ = GRADSYNC_OK;
  Parent parent_;
  std::map<int32_t, std::string> lost_ranks_;
  std::unordered_map<std::string, PendingTensor> pending_;
  std::vector<PendingTensor*> last_submitted_;  // by local rank
  struct GroupAssembly {
    ReadyUnit unit;
    uint32_t expected = 0;
    uint32_t seen = 0;
    std::optional<std::pair<gradsync_result, std::string>> failure;
  };

  // Groups being assembled, by local rank 0's group id.
  std::unordered_map<uint64_t, GroupAssembly> groups_;
  std::deque<ReadyUnit> ready_;
  uint64_t ready_count_ = 0;  // units that became ready, ever
  double stall_seconds_ = 0;
  Qos qos_;
  StepMeter steps_;
  std::optional<Autotuner> autotuner_;
  size_t autotune_events_ = 0;  // trials (and the choice) take_autotune_events gave
  bool autotune_choice_taken_ = false;
  UnitPool unit_pool_;                    // before network_, which returns units to it
  std::unique_ptr<TraceRecorder> trace_;  // before network_, which refers to it: goes after
  std::unique_ptr<NodeJob> network_;
};

// Checks that all ranks agree on a collective; returns the error naming tensor and ranks.
std::optional<std::string> find_mismatch(const std::vector<Submission>& ranks);

}  // namespace gradsync::daemon
