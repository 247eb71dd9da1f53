// The engine thread: polls the clients' submission rings, negotiates, fuses ready collectives
// into batches and runs them. It owns every Session and Job; the control thread talks to it
// only through posted commands.
#pragma once

#include "daemon/aggregator/aggregator.h"
#include "daemon/base/config.h"
#include "daemon/device/device_streams.h"
#include "daemon/device/devices.h"
#include "daemon/engine/executor.h"
#include "daemon/engine/inspect.h"
#include "daemon/engine/job.h"
#include "daemon/engine/reduce_pool.h"
#include "daemon/job/session.h"
#include "daemon/memory/host_mapper.h"
#include "daemon/memory/mapping_cache.h"
#include "daemon/qos/fair_share.h"
#include "daemon/qos/wire_pacer.h"
#include "metrics/metrics.h"
#include "transport/mesh.h"

#include <spdlog/logger.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace gradsync::daemon {

struct AttachSession {
  std::unique_ptr<Session> session;
};
// Memory a client registered: its handle, and the mapping the control thread made when it
// checked the registration.
struct HostRegistration {
  HostHandle handle;
  std::shared_ptr<const HostBuffer> mapped;
};
struct DeviceRegistration {
  DeviceHandle handle;
  std::shared_ptr<const DeviceBuffer> mapped;
};
struct AddBuffer {
  uint64_t session;
  uint32_t buffer_id;
  std::optional<HostRegistration> host;  // one of the two
  std::optional<DeviceRegistration> device;
  std::promise<void> done;  // the control thread replies to the client only after this
};
struct AddEvents {
  uint64_t session;
  std::shared_ptr<const ClientEvents> events;
  std::promise<void> done;  // replied to only after this
};
struct RemoveBuffer {
  uint64_t session;
  uint32_t buffer_id;
};
// How a rank leaves a job: with a goodbye, or by its connection ending (its process died, or
// exited without leaving), which fails the jobs that are parts of its job and hold it.
enum class Departure : uint8_t { kLeft, kLost };
struct DetachSession {
  uint64_t session;
  std::string reason;
  Departure how = Departure::kLost;
};
struct Shutdown {
  std::string reason;
};
// The configuration after a reload (SIGHUP); keys that need a restart carry their old values.
struct Reconfigure {
  DaemonConfig config;
};
using EngineCommand = std::variant<AttachSession, AddBuffer, AddEvents, RemoveBuffer, DetachSession,
                                   Shutdown, Reconfigure, InspectEngine, StartTrace>;

class Engine {
 public:
  using Clock = std::chrono::steady_clock;

  Engine(const DaemonConfig& config, metrics::Metrics& metrics, const Devices& devices);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe; wakes the engine.
  void post(EngineCommand command);
  // Wakes the engine if it sleeps (for the watchdog's check that it comes round).
  void poke();
  // When the engine last came round its loop.
  std::chrono::steady_clock::time_point heartbeat() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(heartbeat_.load(std::memory_order_relaxed)));
  }

  // HOST:PORT of the inter-node listener (the port resolved when configured as 0); empty
  // when the daemon serves single-node jobs only.
  const std::string& listen_address() const { return listen_address_; }

  // The engine thread's body. Returns after a Shutdown command has failed all pending work.
  void run();

 private:
  bool drain_commands();
  void handle(AttachSession& command);
  void handle(AddBuffer& command);
  void handle(RemoveBuffer& command);
  void handle(AddEvents& command);
  void handle(DetachSession& command);
  void handle(Shutdown& command);
  void handle(Reconfigure& command);
  void handle(InspectEngine& command);  // engine_inspect.cpp
  void handle(StartTrace& command);

  bool poll_submissions(Session& session);
  // A submission's buffer: host memory from the session, device memory from the cache (mapped
  // again if it was evicted).
  RegisteredMemory registered_memory(Session& session, uint32_t id);
  // A stream-ordered submission gets its session's events, or an error if it cannot have them.
  static void attach_events(const Session& session, Submission& submission);
  bool poll_peers();
  // Logs and counts the handshakes that ended; forms the jobs that waited for them.
  bool take_handshakes();
  // Fails the jobs of the peers that failed since the last call.
  bool take_failed_peers();
  void drain_ended_jobs();
  // `tag`: the message's UCX tag (names the sending node and, hashed, the job), to fail the
  // job a message that cannot be read was for; 0 when replaying a message read before.
  void handle_node_message(std::span<const uint8_t> payload, uint64_t tag = 0);
  // A message between jobs' nodes and aggregators (aggregation.capnp): an aggregator serves
  // it; a node takes an aggregator's error for the job it names.
  void handle_aggregation_message(std::span<const uint8_t> payload, uint64_t tag);
  // Fails the jobs whose hashed name `tag` carries, naming its sending node: "node N <what>".
  void fail_jobs_of_tag(uint64_t tag, gradsync_result status, const std::string& what);
  // How a job's failure is logged: a fault as a warning; a peer that ended the job once the
  // work it agreed to was done (its ranks left), or a part's rank gone from its parent (as at
  // the end of any program that exits without leaving), as one only where work here waited.
  enum class JobFailure : uint8_t { kFault, kPeerEnded, kRankGone };
  void fail_job(Job& job, gradsync_result status, const std::string& reason, bool tell_peers,
                JobFailure kind = JobFailure::kFault);
  // Ranks of `job` lost (Departure::kLost) here or on another node: recorded, and every job
  // here that is a part of it (Job::parent) and holds one of them fails.
  void lose_ranks(Job& job, std::span<const int32_t> ranks, const std::string& reason);
  // A part of a job that lost one of its ranks before this part came here fails at once.
  void check_parent(Job& part);
  bool run_ready_batches();
  // Shares between jobs (engine_local.cpp, docs/qos.md). The host work of single-node jobs,
  // a piece at a time in weighted-fair order; true if any ran.
  bool run_local_work();
  // A job's next piece of host work (docs/priority.md): of the batch it runs, or of a new one
  // started with a ready unit, whichever ranks highest (priority.h); a batch running goes on
  // where none outranks it.
  struct LocalTurn {
    static constexpr size_t kNone = SIZE_MAX;
    size_t running = kNone;  // index into the job's running batches
    size_t ready = kNone;    // or into its ready units
    uint64_t bytes = 0;      // what is left of that work; 0: the job has none
  };
  LocalTurn next_local_turn(Job& job) const;
  // Runs the piece `turn` names (starting its batch first if it is a ready unit) and, once the
  // batch is done, completes it. `waiting`: the other jobs whose work waited meanwhile.
  void serve_local_piece(Job& job, const LocalTurn& turn, std::span<Job* const> waiting);
  // Runs what is left of the job's batches now, before a rank of it leaves or the daemon stops.
  void finish_local_batch(Job& job);
  // Places the job in the fair order and the pacer with the share the rules give it (again
  // after a reload: logged where it changed).
  void apply_share(Job& job);
  // The jobs' shares in the metrics (export_samples).
  void sample_shares();
  // Metrics and step accounting of a unit done on this node; returns its collectives.
  uint64_t record_local_completion(Job& job, const ReadyUnit& unit, Clock::time_point end);
  // Device units (engine_device.cpp): enqueued on the daemon's streams, completed when their
  // fence is reached; the engine polls them while any is in flight.
  void launch_device_unit(Job& job, ReadyUnit unit);
  // Whether the writes of `unit`'s stream-ordered ranks are done (ranks_written).
  bool device_inputs_done(const ReadyUnit& unit);
  bool poll_device_work();
  // A session leaving: its parts of device work in flight are not completed to it.
  void forget_device_work_of(const Session& session);
  // Runs the collectives every node of a multi-node job agreed on, in order.
  bool run_agreed(Job& job);
  bool check_formation(std::chrono::steady_clock::time_point now);
  // Once a second: warns of tensors some ranks or nodes wait on (stall_warning_seconds),
  // fails jobs stalled for stall_shutdown_seconds, ends traces past their time, frees staging
  // memory unused for scratch_unused_seconds, and exports the sampled metrics.
  bool inspect_stalls(std::chrono::steady_clock::time_point now);  // engine_inspect.cpp
  void export_samples();  // jobs, their progress and stall ages, peer traffic
  // Logs the job's autotune trials and choice since the last call (and to autotune_log).
  void log_autotune(Job& job);
  // The mapping caches' lookups since the last report (once a second, and as clients leave:
  // an engine with no job left samples nothing).
  void report_mapping_lookups();
  void export_job_states();
  int sleep_timeout_ms() const;  // until the next formation deadline; -1: none
  void sleep_until_work();
  bool any_submission_waiting();
  void set_sleeping(uint32_t value);

  DaemonConfig config_;  // engine-thread only: a reload comes as a command
  metrics::Metrics& metrics_;
  std::shared_ptr<spdlog::logger> log_;
  ReducePool pool_;
  // Shares between jobs (docs/qos.md): the engine's fair order of single-node host work, and
  // the pacer of every job's sends to other nodes. Before the jobs, whose tasks hold the
  // pacer's tickets until they go.
  FairShare engine_share_;
  WirePacer wire_pacer_;
  uint64_t next_flow_ = 1;
  // Single-node batches run in pieces, by the flow of their job, in the order they started. A
  // batch of higher priority starts while one of lower priority runs, up to this many.
  struct RunningBatch {
    LocalBatch batch;
    int32_t priority = 0;
    uint64_t order = 0;  // its first unit's (priority.h)
    Clock::time_point start;
    double seconds = 0;  // in its pieces
  };
  static constexpr size_t kMaxRunningBatches = 4;
  std::unordered_map<uint64_t, std::vector<RunningBatch>> running_batches_;
  // Clients' memory, by (session, buffer id): every session's, so that one bound holds for
  // the daemon's mappings of each kind (host_mapping_cache_entries: shared-memory mappings;
  // device_mapping_cache_entries: open CUDA IPC mappings).
  MappingCache<HostMapper> host_buffers_;
  MappingCache<DeviceMapper> device_buffers_;
  // The caches' lookup counters as last handed to the metrics.
  MappingCounters reported_lookups_;
  MappingCounters memo_lookups_;  // answered by a look's BufferMemo (poll_submissions)
  // Device units in flight, oldest first; they hold their buffers' mappings. Declared before
  // the streams: those are destroyed first, waiting for the work, and the mappings after.
  struct DeviceUnit {
    std::string job;
    ReadyUnit unit;
    DeviceStreams::Fence fence = 0;
    Clock::time_point start;
    bool failed = false;  // failed to start: its ranks were told; kept for its mappings
  };
  std::deque<DeviceUnit> device_in_flight_;
  DeviceStreams device_streams_;
  std::unique_ptr<transport::Mesh> mesh_;  // null without an inter-node listener
  // The aggregator role's service (docs/aggregators.md); null on a node. After the mesh, whose
  // operations its collectives hold.
  std::unique_ptr<Aggregator> aggregator_;
  std::string listen_address_;
  std::chrono::steady_clock::time_point next_stall_inspection_{};
  std::atomic<std::chrono::steady_clock::rep> heartbeat_{0};
  size_t network_jobs_ = 0;  // jobs with a NodeJob: the mesh is polled only while there are any
  // Control messages for jobs that have no rank here yet, replayed when one connects; and the
  // joins of a job re-forming under the name of one that failed here and has not ended yet.
  std::unordered_map<std::string, std::vector<std::vector<uint8_t>>> early_messages_;
  // Jobs across nodes that ended here, by name: what their peers still send is drained from
  // the mesh (drain_ended_jobs) until `until`, and none of it is kept as early but the joins of
  // a new job of that name.
  struct EndedJob {
    uint16_t tag;
    std::chrono::steady_clock::time_point until;
  };
  std::unordered_map<std::string, EndedJob> ended_jobs_;
  ipc::UniqueFd epoll_;
  ipc::UniqueFd wake_;

  std::mutex commands_mutex_;
  std::vector<EngineCommand> commands_;  // guarded by commands_mutex_
  // Set with each post: lets the polling loop skip the mutex when there is nothing to take.
  std::atomic<bool> commands_posted_{false};

  std::unordered_map<uint64_t, std::unique_ptr<Session>> sessions_;
  std::vector<Session*> polled_;  // sessions_ in a flat list for the polling loop
  std::unordered_map<std::string, std::unique_ptr<Job>> jobs_;
  bool stopping_ = false;
};

}  // namespace gradsync::daemon
