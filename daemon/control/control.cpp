#include "daemon/control/control.h"

#include "daemon/base/log.h"
#include "daemon/control/admission.h"
#include "daemon/control/unix_listener.h"
#include "daemon/links/links.h"
#include "ipc/protocol.h"
#include "ipc/segment.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <fmt/format.h>
#include <kj/exception.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <new>

namespace gradsync::daemon {
namespace {

// systemd's watchdog interval for this process (WATCHDOG_USEC), or zero.
std::chrono::microseconds watchdog_interval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0) return std::chrono::microseconds(0);
  return std::chrono::microseconds(usec);
}

}  // namespace
namespace {

constexpr uint64_t kListenerTag = 0;
constexpr uint64_t kSignalTag = UINT64_MAX;

void epoll_add(int epoll, int fd, uint64_t tag) {
  struct epoll_event event {};
  event.events = EPOLLIN | EPOLLRDHUP;
  event.data.u64 = tag;
  if (::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) != 0)
    throw ipc::SystemError("epoll_ctl", errno);
}

}  // namespace

ControlServer::ControlServer(DaemonConfig config, Engine& engine, metrics::Metrics& metrics,
                             DaemonInfo info, Devices devices, ConfigSource reload)
    : config_(std::move(config)),
      engine_(engine),
      devices_(std::move(devices)),
      metrics_(metrics),
      log_(logger("control")),
      info_(std::move(info)),
      reload_(std::move(reload)),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      watchdog_(watchdog_interval(), EngineWatchdog::Clock::now()) {
  if (!epoll_.valid()) throw ipc::SystemError("epoll_create1", errno);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  signals_.reset(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signals_.valid()) throw ipc::SystemError("signalfd", errno);
  listener_ = bind_listener(config_);
  socket_bound_ = true;
  epoll_add(epoll_.get(), listener_.get(), kListenerTag);
  epoll_add(epoll_.get(), signals_.get(), kSignalTag);
  log_->info("listening on {}", config_.socket_path);
}

ControlServer::~ControlServer() {
  clients_.clear();
  if (socket_bound_) ::unlink(config_.socket_path.c_str());
}

void ControlServer::run() {
  sd_notifyf(0, "READY=1\nSTATUS=serving on %s", config_.socket_path.c_str());
  if (watchdog_.enabled()) {
    log_->info("systemd watchdog: kept alive while the engine comes round (checked every {} ms)",
               watchdog_.poll_timeout_ms());
  }
  std::array<struct epoll_event, 64> events{};
  while (true) {
    const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                               poll_timeout_ms());
    if (n < 0 && errno != EINTR) throw ipc::SystemError("epoll_wait", errno);
    feed_watchdog();
    deliver_traces();
    for (int i = 0; i < n; ++i) {
      const struct epoll_event& event = events[static_cast<size_t>(i)];
      if (event.data.u64 == kSignalTag) {
        struct signalfd_siginfo info {};
        [[maybe_unused]] ssize_t r = ::read(signals_.get(), &info, sizeof(info));
        if (info.ssi_signo == SIGHUP) {
          reload();
          continue;
        }
        log_->info("signal {}: shutting down", info.ssi_signo);
        sd_notify(0, "STOPPING=1\nSTATUS=stopping: failing work in flight to its ranks");
        // Stop taking clients first, so none connects to a daemon that is going away.
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
        listener_.reset();
        ::unlink(config_.socket_path.c_str());
        socket_bound_ = false;
        engine_.post(Shutdown{"gradsyncd is shutting down"});
        return;
      }
      if (event.data.u64 == kListenerTag) {
        accept_clients();
        continue;
      }
      const auto it = clients_.find(event.data.u64);
      if (it != clients_.end()) serve(*it->second);
    }
  }
}

void ControlServer::feed_watchdog() {
  switch (watchdog_.check(EngineWatchdog::Clock::now(), engine_.heartbeat())) {
    case EngineWatchdog::Verdict::kNotYet:
      return;
    case EngineWatchdog::Verdict::kAlive:
      sd_notify(0, "WATCHDOG=1");
      if (engine_silent_) log_->warn("the engine thread answers again");
      engine_silent_ = false;
      break;
    case EngineWatchdog::Verdict::kEngineSilent:
      if (!engine_silent_) {
        log_->error("the engine thread has not come round: holding back systemd's watchdog");
      }
      engine_silent_ = true;
      break;
  }
  engine_.poke();
}

void ControlServer::accept_clients() {
  while (true) {
    ipc::UniqueFd socket(
        ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!socket.valid()) {
      if (errno != EAGAIN && errno != EINTR) log_->warn("accept: {}", std::strerror(errno));
      return;
    }
    auto client = std::make_unique<Client>();
    socklen_t length = sizeof(client->credentials);
    if (::getsockopt(socket.get(), SOL_SOCKET, SO_PEERCRED, &client->credentials, &length) != 0) {
      log_->warn("SO_PEERCRED: {}", std::strerror(errno));
      continue;
    }
    if (clients_.size() >= config_.max_clients) {
      client->socket = std::move(socket);
      reply_error(*client, GRADSYNC_ERR_CONNECT,
                  fmt::format("gradsyncd serves at most {} clients", config_.max_clients));
      metrics_.client_rejected("too_many_clients");
      continue;
    }
    client->id = next_client_id_++;
    client->socket = std::move(socket);
    epoll_add(epoll_.get(), client->socket.get(), client->id);
    log_->debug("client {} connected: pid {} uid {}", client->id, client->credentials.pid,
                client->credentials.uid);
    clients_.emplace(client->id, std::move(client));
    metrics_.set_connected_clients(static_cast<int64_t>(clients_.size()));
  }
}

void ControlServer::serve(Client& client) {
  const uint64_t id = client.id;
  try {
    while (true) {
      const auto result = client.reader.read_some(client.socket.get());
      while (auto frame = client.reader.next_frame()) {
        handle_frame(client, *frame);
        if (!clients_.contains(id)) return;  // the frame was a goodbye
      }
      if (result == ipc::FrameReader::ReadResult::kWouldBlock) return;
      if (result == ipc::FrameReader::ReadResult::kClosed) {
        disconnect(id,
                   fmt::format("local rank {} (pid {}) of job '{}' disconnected", client.local_rank,
                               client.credentials.pid, client.job),
                   Departure::kLost);
        return;
      }
    }
  } catch (const ipc::ProtocolError& e) {
    // The stream cannot be trusted past a framing error: answer, then hang up.
    reply_error(client, GRADSYNC_ERR_PROTOCOL, e.what());
    metrics_.client_rejected("protocol");
    disconnect(id,
               fmt::format("local rank {} (pid {}) of job '{}' sent a malformed message: {}",
                           client.local_rank, client.credentials.pid, client.job, e.what()),
               Departure::kLost);
  } catch (const std::exception& e) {
    disconnect(id,
               fmt::format("local rank {} (pid {}) of job '{}' lost its connection: {}",
                           client.local_rank, client.credentials.pid, client.job, e.what()),
               Departure::kLost);
  }
}

void ControlServer::handle_frame(Client& client, ipc::Frame& frame) {
  try {
    ipc::DecodedMessage message(frame.payload);
    const auto request = message.root<ipc::wire::Request>();
    if (!client.joined && request.which() != ipc::wire::Request::HELLO &&
        request.which() != ipc::wire::Request::INSPECT) {
      throw Refusal{GRADSYNC_ERR_PROTOCOL, "the first message must be a hello"};
    }
    switch (request.which()) {
      case ipc::wire::Request::HELLO:
        if (client.joined) throw Refusal{GRADSYNC_ERR_PROTOCOL, "hello sent twice"};
        handle_hello(client, request.getHello());
        break;
      case ipc::wire::Request::REGISTER_BUFFER:
        handle_register(client, request.getRegisterBuffer(), frame.fds);
        break;
      case ipc::wire::Request::UNREGISTER_BUFFER:
        handle_unregister(client, request.getUnregisterBuffer().getBufferId());
        break;
      case ipc::wire::Request::REGISTER_EVENTS:
        handle_register_events(client, request.getRegisterEvents(), frame.fds);
        break;
      case ipc::wire::Request::INSPECT:
        handle_inspect(client, request.getInspect());
        break;
      case ipc::wire::Request::GOODBYE:
        reply_ok(client);
        disconnect(client.id,
                   fmt::format("local rank {} (pid {}) of job '{}' left the job", client.local_rank,
                               client.credentials.pid, client.job),
                   Departure::kLeft);
        break;
      default:
        throw Refusal{GRADSYNC_ERR_PROTOCOL, "unknown request type"};
    }
  } catch (const Refusal& refusal) {
    log_->warn("client {} (pid {}): {}", client.id, client.credentials.pid, refusal.message);
    metrics_.client_rejected(refusal.code == GRADSYNC_ERR_PERMISSION ? "permission" : "invalid");
    reply_error(client, refusal.code, refusal.message);
  } catch (const kj::Exception& e) {
    throw ipc::ProtocolError(std::string("malformed control message: ") +
                             e.getDescription().cStr());
  }
}

HelloRules ControlServer::hello_rules() const {
  return HelloRules{info_.listen_address,
                    config_.allreduce_algorithm,
                    config_.allreduce_wire_codec,
                    config_.autotune,
                    ipc::split_addresses(config_.aggregators),
                    config_.role != "aggregator"};
}

void ControlServer::handle_hello(Client& client, ipc::wire::Hello::Reader hello) {
  const ClientIdentity who =
      validate_hello(hello, client.credentials.pid, client.credentials.uid, hello_rules());
  if (const auto existing = jobs_.find(who.job); existing != jobs_.end()) {
    const JobRecord& job = existing->second;
    if (job.owner != who.uid) {
      throw Refusal{GRADSYNC_ERR_PERMISSION,
                    fmt::format("job '{}' belongs to uid {}; uid {} may not join it", who.job,
                                job.owner, who.uid)};
    }
    if (!job.failure.empty()) {
      throw Refusal{GRADSYNC_ERR_PEER_FAILED,
                    fmt::format("job '{}' has failed ({}); its remaining ranks must leave before "
                                "it can form again",
                                who.job, job.failure)};
    }
    if (job.nodes != who.nodes || job.node_rank != who.node_rank) {
      throw Refusal{GRADSYNC_ERR_MISMATCH,
                    fmt::format("job '{}': this rank's GRADSYNC_NODES or node rank differs from "
                                "the job's first rank's",
                                who.job)};
    }
    if (job.parent_job != who.parent_job || job.parent_ranks != who.parent_ranks) {
      throw Refusal{GRADSYNC_ERR_MISMATCH,
                    fmt::format("job '{}': this rank's parent job or ranks in it differ from "
                                "the job's first rank's",
                                who.job)};
    }
    if (job.local_world_size != who.local_world_size) {
      throw Refusal{GRADSYNC_ERR_MISMATCH,
                    fmt::format("job '{}' has {} local ranks; this rank says {}", who.job,
                                job.local_world_size, who.local_world_size)};
    }
    if (job.client_by_rank[static_cast<size_t>(who.local_rank)] != 0) {
      throw Refusal{
          GRADSYNC_ERR_INVALID_ARGUMENT,
          fmt::format("local rank {} of job '{}' is already connected", who.local_rank, who.job)};
    }
  }

  const uint32_t ring_entries = config_.ring_entries;
  const ipc::SegmentLayout layout = ipc::SegmentLayout::for_entries(ring_entries);
  ipc::UniqueFd segment_fd = ipc::create_sealed_memfd("gradsync-control", layout.total_bytes);
  ipc::Mapping segment(segment_fd.get(), 0, layout.total_bytes);
  ipc::SegmentHeader* header = ipc::write_segment_header(segment.data(), ring_entries);
  // Until the engine has attached the session, make the client ring the doorbell.
  header->daemon_sleeping.store(1);
  ipc::UniqueFd doorbell = ipc::create_eventfd();
  const int doorbell_for_client = doorbell.get();

  JobRecord& job = jobs_[who.job];
  if (job.client_by_rank.empty()) {
    job.owner = who.uid;
    job.local_world_size = who.local_world_size;
    job.nodes = who.nodes;
    job.node_rank = who.node_rank;
    job.parent_job = who.parent_job;
    job.parent_ranks = who.parent_ranks;
    job.client_by_rank.assign(static_cast<size_t>(who.local_world_size), 0);
  }
  job.client_by_rank[static_cast<size_t>(who.local_rank)] = client.id;
  client.joined = true;
  client.job = who.job;
  client.local_rank = who.local_rank;
  log_->info("client {} (pid {} uid {}) joined job '{}' as local rank {}/{}", client.id, who.pid,
             who.uid, who.job, who.local_rank, who.local_world_size);

  capnp::MallocMessageBuilder reply;
  auto welcome = reply.initRoot<ipc::wire::Reply>().initWelcome();
  welcome.setClientId(client.id);
  welcome.setRingEntries(ring_entries);
  welcome.setSegmentBytes(layout.total_bytes);
  const auto bytes = ipc::encode(reply);
  const std::array<int, 2> fds = {segment_fd.get(), doorbell_for_client};
  auto session = std::make_unique<Session>(client.id, who, std::move(segment), ring_entries,
                                           std::move(doorbell), metrics_);
  engine_.post(AttachSession{std::move(session)});
  ipc::send_frame(client.socket.get(), bytes, fds);
}

void ControlServer::handle_register(Client& client, ipc::wire::RegisterBuffer::Reader request,
                                    std::vector<ipc::UniqueFd>& fds) {
  const uint32_t id = request.getBufferId();
  const auto memory = request.getMemory();
  if (!memory.isHost() && !memory.isCudaIpc() && !memory.isCudaVmm()) {
    throw Refusal{
        GRADSYNC_ERR_PROTOCOL,
        fmt::format("register buffer {}: a kind of memory this daemon does not know", id)};
  }
  const bool device = !memory.isHost();
  const size_t fds_expected = memory.isHost()      ? 1
                              : memory.isCudaIpc() ? 0
                                                   : memory.getCudaVmm().getSegmentBytes().size();
  if (fds.size() != fds_expected) {
    throw Refusal{GRADSYNC_ERR_PROTOCOL,
                  fmt::format("register buffer {}: expected {} file descriptor{}, got {}", id,
                              fds_expected, fds_expected == 1 ? "" : "s", fds.size())};
  }
  if (client.buffers.contains(id)) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("buffer {} is already registered", id)};
  }
  if (client.buffers.size() >= config_.max_buffers_per_client) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("at most {} buffers per client", config_.max_buffers_per_client)};
  }
  AddBuffer command = device ? device_registration(id, request, std::move(fds))
                             : host_registration(client, id, request, std::move(fds[0]));
  if (command.device) check_mps(client, request.getRankMps(), command.device->mapped->device);
  command.session = client.id;
  auto done = command.done.get_future();
  engine_.post(std::move(command));
  // The client may submit on this buffer as soon as we reply: the engine must know it first.
  done.wait();
  client.buffers.insert(id);
  reply_ok(client);
}

void ControlServer::check_mps(Client& client, ipc::wire::MpsState rank_mps, int ordinal) {
  if (client.mps_mismatch_told || rank_mps == ipc::wire::MpsState::UNKNOWN) return;
  const DeviceInfo& info = devices_.devices().at(static_cast<size_t>(ordinal));
  const bool rank_shared = rank_mps == ipc::wire::MpsState::SHARED;
  if (rank_shared == info.shared_via_mps) return;
  client.mps_mismatch_told = true;
  log_->warn(
      "job '{}' local rank {}: its context on GPU {} is {} through MPS, this daemon's {}: the "
      "two time-slice the GPU (a switch costs about 0.15 ms); run both as clients of one MPS "
      "server (docs/cuda.md)",
      client.job, client.local_rank, info.ordinal, rank_shared ? "shared" : "not shared",
      info.shared_via_mps ? "is" : "is not");
}

AddBuffer ControlServer::host_registration(Client& client, uint32_t id,
                                           ipc::wire::RegisterBuffer::Reader request,
                                           ipc::UniqueFd memfd) {
  const uint64_t offset = request.getOffset();
  const uint64_t bytes = request.getBytes();
  uint64_t size = 0;
  try {
    size = ipc::sealed_memfd_size(memfd.get());
  } catch (const ipc::SystemError& e) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("register buffer {}: {}", id, e.what())};
  }
  validate_range(id, offset, bytes, size);
  AddBuffer command{};
  command.buffer_id = id;
  try {
    // The daemon keeps the memfd open (an evicted range maps again from it), once per memfd:
    // every range of one of the client's arenas shares the fd the first one brought.
    HostHandle handle =
        host_handle(std::make_shared<const ipc::UniqueFd>(std::move(memfd)), offset, bytes);
    auto& kept = client.memfds[{handle.device, handle.inode}];
    if (auto held = kept.lock()) {
      handle.memfd = std::move(held);
    } else {
      kept = handle.memfd;
    }
    std::erase_if(client.memfds, [](const auto& entry) { return entry.second.expired(); });
    auto mapped = map_host_range(handle.memfd->get(), offset, bytes);
    command.host = HostRegistration{std::move(handle), std::move(mapped)};
  } catch (const ipc::SystemError& e) {
    throw Refusal{GRADSYNC_ERR_OUT_OF_MEMORY, fmt::format("register buffer {}: {}", id, e.what())};
  }
  return command;
}

// Opened here, on the control thread, so that a handle the driver rejects or a range past its
// allocation is refused to the client that sent it, before the engine ever sees it.
AddBuffer ControlServer::device_registration(uint32_t id, ipc::wire::RegisterBuffer::Reader request,
                                             std::vector<ipc::UniqueFd> fds) const {
  if (!devices_.available()) {
    throw Refusal{GRADSYNC_ERR_UNSUPPORTED,
                  fmt::format("register buffer {}: device memory is not served here: {}", id,
                              devices_.summary())};
  }
  const auto memory = request.getMemory();
  const bool vmm = memory.isCudaVmm();
  const capnp::Data::Reader handle = vmm ? capnp::Data::Reader() : memory.getCudaIpc().getHandle();
  const capnp::Data::Reader uuid =
      vmm ? memory.getCudaVmm().getDeviceUuid() : memory.getCudaIpc().getDeviceUuid();
  DeviceHandle device;
  if ((!vmm && handle.size() != device.ipc.size()) || uuid.size() != device.device.size()) {
    throw Refusal{
        GRADSYNC_ERR_INVALID_ARGUMENT,
        fmt::format("register buffer {}: a CUDA IPC handle is {} bytes and a device "
                    "UUID {}, got {} and {}",
                    id, device.ipc.size(), device.device.size(), handle.size(), uuid.size())};
  }
  std::copy(handle.begin(), handle.end(), device.ipc.begin());
  std::copy(uuid.begin(), uuid.end(), device.device.begin());
  device.offset = request.getOffset();
  device.bytes = request.getBytes();
  if (device.bytes == 0) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT, fmt::format("register buffer {}: zero bytes", id)};
  }
  AddBuffer command{};
  command.buffer_id = id;
  try {
    if (vmm) {
      std::vector<uint64_t> sizes;
      for (const uint64_t bytes : memory.getCudaVmm().getSegmentBytes()) sizes.push_back(bytes);
      device.segments = devices_.import_segments(std::move(fds), sizes);
    }
    command.device = DeviceRegistration{device, devices_.map(device)};
  } catch (const DeviceError& e) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("register buffer {}: {}", id, e.what())};
  }
  return command;
}

void ControlServer::handle_register_events(Client& client,
                                           ipc::wire::RegisterEvents::Reader request,
                                           const std::vector<ipc::UniqueFd>& fds) {
  if (!fds.empty()) {
    throw Refusal{GRADSYNC_ERR_PROTOCOL,
                  fmt::format("register events: expected no file descriptors, got {}", fds.size())};
  }
  if (!devices_.available()) {
    throw Refusal{GRADSYNC_ERR_UNSUPPORTED,
                  "register events: device memory is not served here: " + devices_.summary()};
  }
  if (client.events_registered) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT, "register events: already registered"};
  }
  const auto list = request.getReadyEvents();
  const capnp::Data::Reader uuid = request.getDeviceUuid();
  DeviceUuid device{};
  if (uuid.size() != device.size()) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("register events: a device UUID is 16 bytes, got {}", uuid.size())};
  }
  std::copy(uuid.begin(), uuid.end(), device.begin());
  std::vector<IpcEventBytes> ready;
  ready.reserve(list.size());
  for (const capnp::Data::Reader handle : list) {
    if (handle.size() != kIpcEventBytes) {
      throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                    fmt::format("register events: an IPC event handle is {} bytes, got {}",
                                kIpcEventBytes, handle.size())};
    }
    IpcEventBytes bytes{};
    std::copy(handle.begin(), handle.end(), bytes.begin());
    ready.push_back(bytes);
  }
  std::vector<IpcEventBytes> completion;
  AddEvents command{client.id, nullptr, {}};
  try {
    command.events = open_client_events(devices_, device, ready, completion);
  } catch (const DeviceError& e) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT, std::string("register events: ") + e.what()};
  }
  auto done = command.done.get_future();
  engine_.post(std::move(command));
  done.wait();  // the client may submit on the slots as soon as we reply
  client.events_registered = true;

  capnp::MallocMessageBuilder reply;
  auto handles = reply.initRoot<ipc::wire::Reply>().initEvents().initCompletionEvents(
      static_cast<unsigned>(completion.size()));
  for (unsigned i = 0; i < completion.size(); ++i) {
    handles.set(i, kj::arrayPtr(completion[i].data(), completion[i].size()));
  }
  ipc::send_frame(client.socket.get(), ipc::encode(reply));
}

void ControlServer::handle_unregister(Client& client, uint32_t buffer_id) {
  if (client.buffers.erase(buffer_id) == 0) {
    throw Refusal{GRADSYNC_ERR_INVALID_ARGUMENT,
                  fmt::format("buffer {} is not registered", buffer_id)};
  }
  engine_.post(RemoveBuffer{client.id, buffer_id});
  reply_ok(client);
}

void ControlServer::reply_ok(Client& client) {
  capnp::MallocMessageBuilder reply;
  reply.initRoot<ipc::wire::Reply>().setOk();
  ipc::send_frame(client.socket.get(), ipc::encode(reply));
}

void ControlServer::reply_error(Client& client, gradsync_result code, const std::string& message) {
  capnp::MallocMessageBuilder reply;
  auto error = reply.initRoot<ipc::wire::Reply>().initError();
  error.setCode(static_cast<uint32_t>(code));
  error.setMessage(message);
  try {
    ipc::send_frame(client.socket.get(), ipc::encode(reply));
  } catch (const std::exception& e) {
    log_->debug("client {}: error reply not delivered: {}", client.id, e.what());
  }
}

void ControlServer::disconnect(uint64_t client_id, const std::string& reason, Departure how) {
  const auto it = clients_.find(client_id);
  if (it == clients_.end()) return;
  Client& client = *it->second;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, client.socket.get(), nullptr);
  if (client.joined) {
    log_->info("client {}: {}", client_id, reason);
    engine_.post(DetachSession{client_id, reason, how});
    auto job = jobs_.find(client.job);
    if (job != jobs_.end()) {
      JobRecord& record = job->second;
      record.client_by_rank[static_cast<size_t>(client.local_rank)] = 0;
      if (record.failure.empty()) record.failure = reason;
      const bool anyone_left =
          std::any_of(record.client_by_rank.begin(), record.client_by_rank.end(),
                      [](uint64_t c) { return c != 0; });
      if (!anyone_left) jobs_.erase(job);
    }
  }
  clients_.erase(it);
  metrics_.set_connected_clients(static_cast<int64_t>(clients_.size()));
}

}  // namespace gradsync::daemon
