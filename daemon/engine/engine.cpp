#include "daemon/engine/engine.h"

#include "daemon/base/log.h"
#include "daemon/collectives/local/device_work.h"
#include "daemon/engine/executor.h"
#include "daemon/node/node_job.h"
#include "ipc/messages.h"

#include <fmt/format.h>

#include <sched.h>
#include <sys/epoll.h>

#include <array>
#include <chrono>
#include <cstring>

namespace gradsync::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// Tags in epoll data for the engine's own wake-up eventfd and UCX's; sessions use their id
// (never 0, never the maximum).
constexpr uint64_t kWakeTag = 0;
constexpr uint64_t kMeshTag = UINT64_MAX;
// How long the engine sleeps at most while collectives across nodes are in flight.
constexpr auto kNetworkPollInterval = std::chrono::milliseconds(1);
// While UCX holds unfinished sends, the engine polls for this long after its last work before
// it sleeps (Mesh::unfinished_sends); a send that stays held longer (its peer is gone or stuck)
// is then progressed every kNetworkPollInterval, not polled for at full speed.
constexpr auto kHeldSendSpin = std::chrono::milliseconds(2);
constexpr auto kCompletionRoomPollInterval = std::chrono::milliseconds(10);
constexpr auto kDevicePollInterval = std::chrono::milliseconds(1);
constexpr auto kEndedJobDrainInterval = std::chrono::milliseconds(100);
// Operations of failed collectives that UCX still holds (Mesh::retire) are released by the
// mesh's progress once UCX is done with them, or once the connections that could finish them
// have closed, which progress also sees. Nothing wakes the engine for either: with no job left
// to progress the mesh, it looks this often until they are gone, so that a failed job's
// buffers (its clients' mappings) do not wait for the next job.
constexpr auto kRetiredPollInterval = std::chrono::milliseconds(100);
// How long after a job ended here its peers may still send to it: they fail it within their
// peer timeout; this much more covers their aborts and retries in flight.
constexpr auto kEndedJobGrace = std::chrono::seconds(10);
// While jobs share the links to other nodes, the bytes of sends UCX holds (could not hand to
// the network yet) before the pacer holds back the next: one pipeline piece, so that grants
// in fair order become the order on the wire (wire_pacer.h).
constexpr uint64_t kWireWindowBytes = cost_model::kPipelinePieceBytes;

metrics::CollectiveKind kind_of(ipc::Collective c) {
  return static_cast<metrics::CollectiveKind>(c);
}

}  // namespace

Engine::Engine(const DaemonConfig& config, metrics::Metrics& metrics, const Devices& devices)
    : config_(config),
      metrics_(metrics),
      log_(logger("engine")),
      pool_(config.reduce_threads),
      wire_pacer_(kWireWindowBytes),
      host_buffers_(HostMapper{}, config.host_mapping_cache_entries),
      device_buffers_(DeviceMapper(devices), config.device_mapping_cache_entries),
      device_streams_(devices),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wake_(ipc::create_eventfd()) {
  if (!epoll_.valid()) throw ipc::SystemError("epoll_create1", errno);
  struct epoll_event event {};
  event.events = EPOLLIN;
  event.data.u64 = kWakeTag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &event) != 0) {
    throw ipc::SystemError("epoll_ctl(engine wake)", errno);
  }
  if (!config.listen.empty()) {
    transport::MeshOptions options{config.listen, config.tcp_keepalive_idle_seconds,
                                   config.tcp_keepalive_interval_seconds};
    // The pacer's window and the transport's backlog are one figure: held past it, sends
    // wait for the pacer (shared) or tell it the link is full (alone).
    options.backlog_bytes = kWireWindowBytes;
    options.tcp_rendezvous_min_bytes = config.tcp_bulk_protocol == "eager"
                                           ? transport::MeshOptions::kEveryMessageEager
                                           : config.tcp_rendezvous_min_bytes;
    if (!config.cluster_key_file.empty()) {
      options.cluster_key = transport::ClusterKey::load(config.cluster_key_file);
    } else {
      log_->warn(
          "no cluster_key_file: node daemons are not authenticated (only daemons without "
          "a key are accepted)");
    }
    mesh_ = std::make_unique<transport::Mesh>(options);
    listen_address_ =
        config.listen.substr(0, config.listen.rfind(':')) + ":" + std::to_string(mesh_->port());
    event.data.u64 = kMeshTag;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, mesh_->event_fd(), &event) != 0) {
      throw ipc::SystemError("epoll_ctl(ucx)", errno);
    }
    const uint64_t rendezvous = mesh_->rendezvous_min_bytes();
    log_->info(
        "inter-node listener on {}; UCX network transports: {}; bulk data {}; device "
        "memory staged through pinned host memory ({})",
        listen_address_, fmt::join(mesh_->network_transports(), ", "),
        rendezvous == transport::MeshOptions::kEveryMessageEager ? "eager (TCP only)"
        : rendezvous == 0                                        ? "as UCX chooses"
                          : fmt::format("by rendezvous from {} bytes (TCP only)", rendezvous),
        mesh_->moves_cuda_memory() ? "this UCX could move CUDA memory itself; not used"
                                   : "this UCX moves host memory only");
  }
  if (config.role == "aggregator") {
    aggregator_ = std::make_unique<Aggregator>(
        *mesh_, metrics_,
        AggregatorSettings{listen_address_, std::chrono::seconds(config.peer_timeout_seconds)});
    log_->info("role: aggregator: sums the allreduces of other nodes' jobs that list {}",
               listen_address_);
  }
  log_->info("reduce pool of {} threads", pool_.size());
}

Engine::~Engine() = default;

void Engine::post(EngineCommand command) {
  {
    std::lock_guard lock(commands_mutex_);
    commands_.push_back(std::move(command));
    commands_posted_.store(true, std::memory_order_release);
  }
  ipc::eventfd_signal(wake_.get());
}

void Engine::run() {
  auto last_work = Clock::now();
  while (!stopping_) {
    bool progressed = drain_commands();
    for (Session* session : polled_) progressed |= poll_submissions(*session);
    // UCX progress costs about a microsecond: only while a job spans nodes. (Otherwise its
    // fd still wakes a sleeping engine, and a job's first rank picks up what arrived early.)
    if (network_jobs_ > 0 || !ended_jobs_.empty() || aggregator_ ||
        (mesh_ &&
         (mesh_->needs_service() || mesh_->unfinished_sends() > 0 || mesh_->retired_count() > 0))) {
      progressed |= poll_peers();
    }
    progressed |= run_ready_batches();
    if (aggregator_) progressed |= aggregator_->progress(Clock::now());
    if (!device_in_flight_.empty()) progressed |= poll_device_work();
    if (device_streams_.holding()) progressed |= device_streams_.collect();
    // One clock read a round, for the watchdog's heartbeat, the deadline checks and the spin:
    // each costs tens of nanoseconds here, and an idle round is a few hundred.
    const auto now = Clock::now();
    heartbeat_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    progressed |= check_formation(now);
    progressed |= inspect_stalls(now);
    // After everything that completes requests this round (Session::wake_if_owed).
    for (Session* session : polled_) session->wake_if_owed();
    metrics_.flush_completions();
    if (progressed) {
      last_work = now;
      continue;
    }
    // A send UCX holds back (its TCP socket was full) moves only when we progress: nothing
    // wakes a sleeping engine when the socket drains (Mesh::unfinished_sends).
    const bool sends_held = mesh_ && mesh_->unfinished_sends() > 0;
    const auto spin = sends_held
                          ? std::max<Clock::duration>(
                                kHeldSendSpin, std::chrono::microseconds(config_.engine_spin_us))
                          : std::chrono::microseconds(config_.engine_spin_us);
    // Device work in flight, and ranks' writes that a device unit or a stage across nodes
    // waits for, are polled without sleeping: a copy or a reduce is done within microseconds
    // to milliseconds, and a millisecond's sleep would add up to as much to each stage of a
    // collective (the driver has no fd to wake us). (Writes found awaited in a round that
    // spun anyway are taken at the next look: one yield more at most.)
    if (now - last_work < spin || device_streams_.pending() ||
        device_streams_.take_writes_awaited()) {
      // Yield rather than spin hard: on a machine with few cores the ranks we wait for need
      // the CPU we would burn.
      sched_yield();
      continue;
    }
    sleep_until_work();
    last_work = Clock::now();
  }
}

void Engine::poke() {
  ipc::eventfd_signal(wake_.get());
}

bool Engine::drain_commands() {
  if (!commands_posted_.load(std::memory_order_acquire)) return false;
  std::vector<EngineCommand> commands;
  {
    std::lock_guard lock(commands_mutex_);
    commands_posted_.store(false, std::memory_order_relaxed);
    if (commands_.empty()) return false;
    commands.swap(commands_);
  }
  for (auto& command : commands) std::visit([this](auto& c) { handle(c); }, command);
  return true;
}

void Engine::handle(AttachSession& command) {
  Session& session = *command.session;
  const ClientIdentity& who = session.identity();
  auto& job = jobs_[who.job];
  if (!job) {
    job = std::make_unique<Job>(
        who.job, who.local_world_size,
        Clock::now() + std::chrono::seconds(config_.job_formation_timeout_seconds));
    job->qos().owner = who.uid;
    job->set_parent(Job::Parent{who.parent_job, who.parent_ranks});
    apply_share(*job);
    if (!who.nodes.empty()) {
      ended_jobs_.erase(who.job);  // a new job of that name: its messages are wanted
      // A peer that failed while no job used the mesh: the jobs that had it hear of it now, and
      // the new job connects to it afresh (the mesh reconnects only once a failure is told).
      take_failed_peers();
      job->set_network(std::make_unique<NodeJob>(
          who.job, NodeLayout{who.nodes, who.node_rank, who.world_size, who.aggregators}, *mesh_,
          NodeJobSettings{
              std::chrono::seconds(config_.peer_timeout_seconds), config_.response_cache_capacity,
              who.algorithm,
              cost_model::parse_wire_codec(who.wire_codec).value_or(cost_model::WireCodecSpec{}),
              config_.fusion_threshold_bytes, config_.pipeline_piece_bytes,
              // The engine spins no longer than this after work: it must not
              // sleep through a hold.
              std::chrono::microseconds(
                  std::min(config_.negotiation_hold_us, config_.engine_spin_us)),
              std::chrono::microseconds(config_.engine_spin_us),
              config_.tcp_bulk_protocol == "auto" ? mesh_->largest_eager_message() : 0,
              config_.negotiation_relay_min_nodes, config_.aggregation_chunk_bytes,
              config_.aggregator_link_mbps * 1e6 / 8},
          metrics_, device_streams_));
      job->network()->set_pacer(&wire_pacer_, job->qos().flow);
      ++network_jobs_;
      if (auto early = early_messages_.extract(who.job)) {
        for (const auto& payload : early.mapped()) handle_node_message(payload);
      }
    }
  }
  job->attach(session);
  // Node 0's ranks decide whether a job across nodes tunes; the other nodes follow its cycles.
  if (who.autotune && !job->autotuner() && (who.nodes.empty() || who.node_rank == 0)) {
    const bool across_nodes = !who.nodes.empty();
    job->start_autotune(
        TunedSettings{config_.fusion_threshold_bytes, config_.pipeline_piece_bytes,
                      std::min(config_.negotiation_hold_us, config_.engine_spin_us), 0},
        AutotuneLimits{config_.autotune_max_steps,
                       std::chrono::seconds(config_.autotune_max_seconds), across_nodes,
                       across_nodes && who.algorithm == "auto"},
        Clock::now());
    log_->info("job '{}': autotune: {} candidates over at most {} steps or {} s", who.job,
               job->autotuner()->candidates(), config_.autotune_max_steps,
               config_.autotune_max_seconds);
  }
  if (job->locally_formed() && job->network()) {
    // Every local rank is here: the other nodes may now count this one in.
    job->network()->on_local_formed(job->ranks());
    if (auto error = job->network()->form()) fail_job(*job, error->status, error->message, true);
  }
  check_parent(*job);
  struct epoll_event event {};
  event.events = EPOLLIN;
  event.data.u64 = session.id();
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, session.doorbell_fd(), &event) != 0) {
    log_->error("epoll_ctl(add doorbell of client {}): {}", session.id(), std::strerror(errno));
  }
  polled_.push_back(&session);
  // The control thread made the client ring until now; the engine is awake and polls the
  // session from its next round. Left raised, the flag would fall only when the engine next
  // sleeps, which a client that keeps it busy never lets happen: every submission would cost
  // the client a write to the doorbell (161 a step for ResNet-50's names, about 40 µs).
  session.header().daemon_sleeping.store(0, std::memory_order_seq_cst);
  log_->debug("client {} attached: job '{}' local rank {}/{}", session.id(), who.job,
              who.local_rank, who.local_world_size);
  sessions_.emplace(session.id(), std::move(command.session));
  export_job_states();
}

void Engine::handle(AddBuffer& command) {
  if (auto it = sessions_.find(command.session); it != sessions_.end()) {
    const MappingKey key{command.session, command.buffer_id};
    // A registration replaces what was under its id, of either kind.
    host_buffers_.remove(key);
    device_buffers_.remove(key);
    if (command.device) {
      it->second->add_device_buffer(command.buffer_id, command.device->handle.bytes);
      device_buffers_.add(key, command.device->handle, std::move(command.device->mapped));
    } else if (command.host) {
      it->second->add_host_buffer(command.buffer_id, command.host->handle.bytes);
      host_buffers_.add(key, command.host->handle, std::move(command.host->mapped));
    }
    metrics_.mapping_lookups(metrics::Metrics::MappingLookup::kMiss, 1);  // mapped to check it
  }
  command.done.set_value();
}

void Engine::handle(RemoveBuffer& command) {
  if (auto it = sessions_.find(command.session); it != sessions_.end()) {
    if (it->second->remove_buffer(command.buffer_id)) metrics_.mappings_released(1);
  }
  host_buffers_.remove({command.session, command.buffer_id});
  device_buffers_.remove({command.session, command.buffer_id});
}

void Engine::handle(DetachSession& command) {
  const auto it = sessions_.find(command.session);
  if (it == sessions_.end()) return;
  Session& session = *it->second;
  report_mapping_lookups();
  metrics_.mappings_released(session.buffer_count());
  host_buffers_.remove_client(session.id());
  device_buffers_.remove_client(session.id());
  forget_device_work_of(session);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, session.doorbell_fd(), nullptr);
  std::erase(polled_, &session);
  if (Job* job = session.job) {
    const std::string job_name = job->name();
    const bool first_failure = !job->failure();
    finish_local_batch(*job);  // its submissions complete to the sessions while they exist
    job->detach(session, command.reason);
    if (first_failure && job->network()) job->network()->broadcast_abort(command.reason);
    if (command.how == Departure::kLost) {
      const int32_t rank = session.identity().rank;
      lose_ranks(*job, {&rank, 1}, command.reason);
      // The other nodes' parts of this job hold it too, also where this job failed already.
      if (job->network()) job->network()->broadcast_ranks_lost({&rank, 1}, command.reason);
    }
    if (job->empty()) {
      log_autotune(*job);  // what the last second's sample has not logged
      if (job->network()) {
        --network_jobs_;
        if (const Negotiator* negotiator = job->network()->negotiator()) {
          const auto& counters = negotiator->counters();
          log_->debug("job '{}': {} negotiation cycles, {} cache hits, {} misses", job_name,
                      counters.cycles, counters.cache_hits, counters.cache_misses);
        }
        // Peers may still send to it until they hear it failed: drained for a while.
        ended_jobs_[job_name] = EndedJob{
            job->network()->job_tag(),
            Clock::now() + std::chrono::seconds(config_.peer_timeout_seconds) + kEndedJobGrace};
        log_->debug("job '{}' ended; the mesh holds {} retired operations", job_name,
                    mesh_->retired_count());
      }
      metrics_.job_ended(job_name);
      engine_share_.remove(job->qos().flow);
      wire_pacer_.remove(job->qos().flow);
      jobs_.erase(job_name);
    }
  }
  log_->debug("client {} detached: {}", session.id(), command.reason);
  sessions_.erase(it);  // unmaps its segment; buffers go when no collective holds them
  export_job_states();
}

void Engine::handle(Shutdown& command) {
  for (auto& [name, job] : jobs_) {
    finish_local_batch(*job);
    fail_job(*job, GRADSYNC_ERR_DAEMON_GONE, command.reason, true);
  }
  stopping_ = true;
}

bool Engine::poll_submissions(Session& session) {
  ipc::SubmissionEntry entry{};
  uint64_t taken = 0;
  // One clock read for what one look takes off the ring (a read costs tens of nanoseconds
  // here, and a step brings a hundred tensors): their waits count from this look.
  Clock::time_point taken_at{};
  BufferMemo buffers([this, &session](uint32_t id) { return registered_memory(session, id); });
  while (session.next_submission(entry)) {
    if (taken++ == 0) taken_at = Clock::now();
    const ClientIdentity& who = session.identity();
    // Roots and allgather slots count local ranks in a single-node job, global ranks across
    // nodes.
    const bool across_nodes = !who.nodes.empty();
    Submission submission = resolve_submission(
        entry, buffers, across_nodes ? who.rank : who.local_rank,
        across_nodes ? who.world_size : who.local_world_size, session.job->unit_pool().name());
    submission.session = &session;
    if (submission.valid() && submission.event_slot >= 0) attach_events(session, submission);
    if (!submission.valid()) {
      log_->warn("client {} (job '{}' local rank {}): invalid submission: {}", session.id(),
                 who.job, who.local_rank, submission.error);
    }
    session.job->submit(std::move(submission), taken_at);
  }
  if (taken == 0) return false;
  memo_lookups_.hits += buffers.repeats().hits;
  memo_lookups_.unregistered += buffers.repeats().unregistered;
  metrics_.ring_drained(taken);
  return true;
}

void Engine::fail_job(Job& job, gradsync_result status, const std::string& reason, bool tell_peers,
                      JobFailure kind) {
  if (job.failure()) return;
  // A peer's ranks leaving once every node's agreed work is done is how a job ends: nothing
  // is lost where nothing here still waited (the ranks here get the reason if they submit).
  if (job.fail(status, reason) > 0 || kind == JobFailure::kFault) {
    log_->warn("job '{}' failed: {}", job.name(), reason);
  } else if (kind == JobFailure::kPeerEnded) {
    log_->info("job '{}' ended by another node, with nothing waiting here: {}", job.name(), reason);
  } else {
    log_->debug("job '{}' failed, with nothing waiting here: {}", job.name(), reason);
  }
  if (job.network() != nullptr) {
    if (tell_peers) job.network()->broadcast_abort(reason);
    // Whatever failed it, a connection of the job may be the cause and stay silently broken
    // (a cut link): peers that do not answer are disconnected, so the next job reconnects.
    job.network()->check_peers_alive();
  }
}

void Engine::lose_ranks(Job& job, std::span<const int32_t> ranks, const std::string& reason) {
  for (const int32_t rank : ranks) job.add_lost_rank(rank, reason);
  for (auto& [name, part] : jobs_) {
    if (part->parent().job == job.name()) check_parent(*part);
  }
}

void Engine::check_parent(Job& part) {
  if (part.parent().job.empty() || part.failure()) return;
  const auto parent = jobs_.find(part.parent().job);
  if (parent == jobs_.end()) return;
  const auto& lost = parent->second->lost_ranks();
  const std::vector<int32_t>& ranks = part.parent().ranks;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (const auto it = lost.find(ranks[i]); it != lost.end()) {
      const std::string reason =
          fmt::format("rank {} of job '{}', of which job '{}' is a part, is gone: {}", ranks[i],
                      parent->first, part.name(), it->second);
      fail_job(part, GRADSYNC_ERR_PEER_FAILED, reason, true, JobFailure::kRankGone);
      // The part lost it too, for its own parts (a subgroup's pairs). Each job fails once, so
      // this ends however the jobs name their parents.
      const auto rank = static_cast<int32_t>(i);
      lose_ranks(part, {&rank, 1}, reason);
      return;
    }
  }
}

bool Engine::run_ready_batches() {
  bool any = false;
  for (auto& [name, job] : jobs_) {
    auto& ready = job->ready();
    if (NodeJob* network = job->network()) {
      // Across nodes: announce what is ready here, run what every node agreed on, in order.
      while (!ready.empty()) {
        ReadyUnit unit = std::move(ready.front());
        ready.pop_front();
        network->on_locally_ready(std::move(unit), !ready.empty());
        any = true;
      }
      any |= run_agreed(*job);
      continue;
    }
    // Device units to the daemon's streams, done when their fence is; host work runs in
    // turn with the other jobs' (run_local_work), and a device unit after it waits for it.
    while (!ready.empty() && on_device(ready.front()) &&
           !running_batches_.contains(job->qos().flow)) {
      // Not before its stream-ordered ranks' writes are done (polled, as fences are): the
      // daemon's streams never wait on another process's event, which costs a switch
      // between the processes' contexts without MPS even when it is done, and would stop
      // every job's work on the GPU for good if that process died first. The job's later
      // units wait behind it, in order.
      if (!device_inputs_done(ready.front())) break;
      ReadyUnit unit = std::move(ready.front());
      ready.pop_front();
      launch_device_unit(*job, std::move(unit));
      any = true;
    }
  }
  return run_local_work() || any;
}

uint64_t Engine::record_local_completion(Job& job, const ReadyUnit& unit, Clock::time_point end) {
  for (const auto& c : unit.collectives) {
    const ipc::Collective kind = c.first().collective;
    metrics_.collective_completed(kind_of(kind), c.bytes(), "local",
                                  std::chrono::duration<double>(end - c.times.ready).count());
    job.steps().on_completed(bus_bytes(kind, c.bytes(), job.local_world_size()), end);
  }
  return unit.collectives.size();
}

bool Engine::check_formation(Clock::time_point now) {
  // Cheap in the common case: every job formed long ago.
  bool failed = false;
  for (auto& [name, job] : jobs_) {
    if (!job->formed() && job->check_formation(now)) {
      log_->warn("{}", *job->failure());
      failed = true;
    }
  }
  return failed;
}

int Engine::sleep_timeout_ms() const {
  auto deadline = Clock::time_point::max();
  // While there are jobs, wake for the stall inspection (once a second).
  if (!jobs_.empty()) deadline = next_stall_inspection_;
  for (const auto& [name, job] : jobs_) {
    // Collectives across nodes in flight, or the links' probe: wake now and then to check
    // their peers' deadlines. (UCX's fd wakes us for what arrives; a silent peer sends nothing.)
    if (job->network() != nullptr && (job->network()->busy() || job->network()->measuring())) {
      deadline = std::min(deadline, Clock::now() + kNetworkPollInterval);
      break;
    }
  }
  for (const auto& [name, job] : jobs_) {
    if (!job->formed() && !job->failure()) deadline = std::min(deadline, job->formation_deadline());
  }
  // Device work in flight: its fences are polled.
  if (!device_in_flight_.empty()) deadline = std::min(deadline, Clock::now() + kDevicePollInterval);
  // A client whose submissions wait for it to read its completions: look again soon.
  for (const Session* session : polled_) {
    if (session->waits_for_completion_room()) {
      deadline = std::min(deadline, Clock::now() + kCompletionRoomPollInterval);
      break;
    }
  }
  // Collectives an aggregator sums: their nodes' deadlines are watched.
  if (aggregator_ && aggregator_->busy()) {
    deadline = std::min(deadline, Clock::now() + kNetworkPollInterval);
  }
  // What peers still send to ended jobs is drained now and then.
  if (!ended_jobs_.empty()) deadline = std::min(deadline, Clock::now() + kEndedJobDrainInterval);
  if (mesh_ && mesh_->retired_count() > 0)
    deadline = std::min(deadline, Clock::now() + kRetiredPollInterval);
  // A handshake's deadline, and a refused connection's close, are the mesh's to watch; a send
  // UCX holds moves only when progressed.
  if (mesh_ && (mesh_->needs_service() || mesh_->unfinished_sends() > 0))
    deadline = std::min(deadline, Clock::now() + kNetworkPollInterval);
  if (deadline == Clock::time_point::max()) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

void Engine::set_sleeping(uint32_t value) {
  for (Session* session : polled_) {
    session->header().daemon_sleeping.store(value, std::memory_order_seq_cst);
  }
}

bool Engine::any_submission_waiting() {
  for (Session* session : polled_) {
    if (session->has_submission()) return true;
  }
  return false;
}

void Engine::sleep_until_work() {
  // Announce the sleep, then look once more: a client that published a submission before
  // seeing the flag will not ring the doorbell, so we must see its entry here.
  set_sleeping(1);
  // UCX must be armed before its fd can wake us; false means events are pending already.
  const bool armed = !mesh_ || mesh_->arm();
  if (armed && !any_submission_waiting()) {
    std::array<struct epoll_event, 64> events{};
    const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                               sleep_timeout_ms());
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = events[static_cast<size_t>(i)].data.u64;
      if (tag == kWakeTag) {
        ipc::eventfd_drain(wake_.get());
      } else if (auto it = sessions_.find(tag); it != sessions_.end()) {
        ipc::eventfd_drain(it->second->doorbell_fd());
      }
    }
  }
  set_sleeping(0);
}

}  // namespace gradsync::daemon
