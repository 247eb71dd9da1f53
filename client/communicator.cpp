#include "client/communicator.h"

#include "client/daemon_socket.h"

#include "client/wait_policy.h"
#include "ipc/messages.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <span>

namespace gradsync::client {
namespace {

using Clock = std::chrono::steady_clock;

// A sleeping waiter wakes this often to check that the daemon is still there.
constexpr int64_t kLivenessCheckNs = 100'000'000;

int timeout_ms(const gradsync_options& options) {
  return options.timeout_ms > 0 ? options.timeout_ms : 30'000;
}

}  // namespace

Communicator::Communicator(const gradsync_options& options, const gradsync_job_settings& settings)
    : options_(options),
      socket_(connect_to_daemon(std::string(
          options.socket_path, strnlen(options.socket_path, sizeof(options.socket_path))))) {
  capnp::MallocMessageBuilder message;
  auto hello = message.initRoot<ipc::wire::Request>().initHello();
  hello.setProtocolVersion(ipc::kProtocolVersion);
  hello.setJob(options.job);
  hello.setRank(options.rank);
  hello.setWorldSize(options.world_size);
  hello.setLocalRank(options.local_rank);
  hello.setLocalWorldSize(options.local_world_size);
  const std::vector<std::string> nodes = ipc::split_addresses(
      std::string_view(options.nodes, strnlen(options.nodes, sizeof(options.nodes))));
  auto node_builder = hello.initNodes(static_cast<unsigned>(nodes.size()));
  for (size_t i = 0; i < nodes.size(); ++i) node_builder.set(static_cast<unsigned>(i), nodes[i]);
  hello.setNodeRank(nodes.empty() ? 0 : options.node_rank);
  hello.setAlgorithm(
      std::string(options.algorithm, strnlen(options.algorithm, sizeof(options.algorithm))));
  hello.setWireCodec(
      std::string(settings.wire_codec, strnlen(settings.wire_codec, sizeof(settings.wire_codec))));
  const std::vector<std::string> aggregators = ipc::split_addresses(std::string_view(
      settings.aggregators, strnlen(settings.aggregators, sizeof(settings.aggregators))));
  auto aggregator_builder = hello.initAggregators(static_cast<unsigned>(aggregators.size()));
  for (size_t i = 0; i < aggregators.size(); ++i) {
    aggregator_builder.set(static_cast<unsigned>(i), aggregators[i]);
  }
  const std::string parent_job(settings.parent_job,
                               strnlen(settings.parent_job, sizeof(settings.parent_job)));
  if (!parent_job.empty()) {
    if (settings.parent_ranks == nullptr) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                  "gradsync_job_settings.parent_job is set but parent_ranks is NULL");
    }
    hello.setParentJob(parent_job);
    // world_size entries (gradsync.h); the daemon checks the values.
    const std::span<const int32_t> ranks(settings.parent_ranks,
                                         static_cast<size_t>(std::max(options.world_size, 0)));
    auto ranks_builder = hello.initParentRanks(static_cast<unsigned>(ranks.size()));
    for (size_t i = 0; i < ranks.size(); ++i) {
      ranks_builder.set(static_cast<unsigned>(i), ranks[i]);
    }
  }
  switch (settings.autotune) {
    case GRADSYNC_AUTOTUNE_ON:
      hello.setAutotune(ipc::wire::Autotune::ON);
      break;
    case GRADSYNC_AUTOTUNE_OFF:
      hello.setAutotune(ipc::wire::Autotune::OFF);
      break;
    default:
      hello.setAutotune(ipc::wire::Autotune::DEFAULT);
  }
  ipc::Frame frame;
  try {
    ipc::send_frame(socket_.get(), ipc::encode(message));
    frame = ipc::receive_frame(socket_.get(), reader_, timeout_ms(options_));
  } catch (const ipc::SystemError& e) {
    // A daemon that dies as the rank joins (reset, closed, silent): gone, as after joining.
    throw Error(GRADSYNC_ERR_DAEMON_GONE,
                std::string("lost the connection to gradsyncd while joining: ") + e.what());
  }
  ipc::DecodedMessage reply(frame.payload);
  const auto root = reply.root<ipc::wire::Reply>();
  if (root.isError()) {
    throw Error(static_cast<gradsync_result>(root.getError().getCode()),
                root.getError().getMessage().cStr());
  }
  if (!root.isWelcome() || frame.fds.size() != 2) {
    throw Error(GRADSYNC_ERR_PROTOCOL, "unexpected reply to hello");
  }
  const auto welcome = root.getWelcome();
  const uint32_t entries = welcome.getRingEntries();
  const ipc::SegmentLayout layout = ipc::SegmentLayout::for_entries(entries);
  if (entries == 0 || layout.total_bytes != welcome.getSegmentBytes()) {
    throw Error(GRADSYNC_ERR_PROTOCOL, "control segment size disagrees with its ring size");
  }
  segment_ = ipc::Mapping(frame.fds[0].get(), 0, layout.total_bytes);
  view_ = ipc::SegmentView::over(segment_.data(), entries);
  if (view_.header->magic != ipc::kSegmentMagic) {
    throw Error(GRADSYNC_ERR_PROTOCOL, "control segment has the wrong magic number");
  }
  submissions_ = ipc::RingProducer<ipc::SubmissionEntry>(view_.submissions, entries);
  completions_ = ipc::RingConsumer<ipc::CompletionEntry>(view_.completions, entries);
  doorbell_ = std::move(frame.fds[1]);
  struct ucred daemon {};
  socklen_t length = sizeof(daemon);
  const bool known = ::getsockopt(socket_.get(), SOL_SOCKET, SO_PEERCRED, &daemon, &length) == 0;
  spin_ = spin_before_sleeping(known ? daemon.pid : 0);
}

Communicator::~Communicator() {
  if (daemon_gone_) return;
  try {
    capnp::MallocMessageBuilder message;
    message.initRoot<ipc::wire::Request>().setGoodbye();
    round_trip(message);
  } catch (const std::exception&) {
    // Leaving anyway: closing the socket tells the daemon just as well.
  }
}

ipc::DecodedMessage Communicator::round_trip(capnp::MessageBuilder& request,
                                             std::span<const int> fds) {
  if (daemon_gone_) throw Error(GRADSYNC_ERR_DAEMON_GONE, daemon_gone_reason_);
  ipc::Frame frame;
  try {
    ipc::send_frame(socket_.get(), ipc::encode(request), fds);
    frame = ipc::receive_frame(socket_.get(), reader_, timeout_ms(options_));
  } catch (const ipc::SystemError& e) {
    daemon_gone_ = true;
    daemon_gone_reason_ = std::string("lost the connection to gradsyncd: ") + e.what();
    throw Error(GRADSYNC_ERR_DAEMON_GONE, daemon_gone_reason_);
  }
  ipc::DecodedMessage reply(frame.payload);
  const auto root = reply.root<ipc::wire::Reply>();
  if (root.isError()) {
    throw Error(static_cast<gradsync_result>(root.getError().getCode()),
                root.getError().getMessage().cStr());
  }
  return reply;
}

void* Communicator::allocate(size_t bytes) {
  void* p = heap_.allocate(bytes);
  if (p == nullptr) {
    throw Error(GRADSYNC_ERR_OUT_OF_MEMORY,
                "cannot allocate " + std::to_string(bytes) + " bytes of shared memory");
  }
  return p;
}

void Communicator::free(void* ptr) {
  if (ptr == nullptr) return;
  const std::optional<size_t> bytes = heap_.allocation_bytes(ptr);
  if (!bytes) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "free: pointer was not returned by gradsync_alloc");
  }
  // Unregister what lies inside the allocation first, so the daemon lets go of it too.
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t end = begin + *bytes;
  std::vector<void*> inside;
  for (auto it = registered_.lower_bound(begin); it != registered_.end() && it->first < end; ++it) {
    inside.push_back(it->second.base);
  }
  for (void* base : inside) unregister(base);
  heap_.deallocate(ptr);
}

void Communicator::register_range(void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "register: null pointer or zero bytes");
  }
  const std::shared_ptr<const SharedHeap::Arena> arena = heap_.arena_of(ptr, bytes);
  if (!arena) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "register: memory must come from gradsync_alloc (one allocation arena)");
  }
  register_in_arena(ptr, bytes, *arena);
}

void Communicator::register_in_arena(void* ptr, size_t bytes, const SharedHeap::Arena& arena) {
  const int fd = arena.fd();
  send_registration(
      ptr, bytes, static_cast<uint64_t>(static_cast<uint8_t*>(ptr) - arena.base()),
      std::span<const int>(&fd, 1), false, {},
      [](ipc::wire::RegisterBuffer::Builder request) { request.getMemory().setHost(); });
}

void Communicator::register_device(void* ptr, size_t bytes, DeviceMemory memory) {
  if (ptr == nullptr || bytes == 0) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "register device memory: null pointer or zero bytes");
  }
  const gradsync_cuda_ipc_memory& description = memory.description;
  std::vector<int> fds;
  fds.reserve(memory.segment_fds.size());
  for (const ipc::UniqueFd& fd : memory.segment_fds) fds.push_back(fd.get());
  send_registration(
      ptr, bytes, description.offset, fds, true, std::move(memory.allocation_ids),
      [&memory, &description](ipc::wire::RegisterBuffer::Builder request) {
        if (memory.shared_via_mps) {
          request.setRankMps(*memory.shared_via_mps ? ipc::wire::MpsState::SHARED
                                                    : ipc::wire::MpsState::NOT_SHARED);
        }
        if (memory.vmm()) {
          auto vmm = request.getMemory().initCudaVmm();
          auto sizes = vmm.initSegmentBytes(static_cast<unsigned>(memory.segment_bytes.size()));
          for (unsigned i = 0; i < sizes.size(); ++i) sizes.set(i, memory.segment_bytes[i]);
          vmm.setDeviceUuid(kj::arrayPtr(description.device_uuid, sizeof(description.device_uuid)));
          return;
        }
        auto cuda = request.getMemory().initCudaIpc();
        cuda.setHandle(kj::arrayPtr(description.handle, sizeof(description.handle)));
        cuda.setDeviceUuid(kj::arrayPtr(description.device_uuid, sizeof(description.device_uuid)));
      });
}

template <typename SetMemory>
void Communicator::send_registration(
    void* ptr, size_t bytes, uint64_t offset, std::span<const int> fds, bool device,
    std::vector<std::pair<const uint8_t*, uint64_t>> allocation_ids, SetMemory set_memory) {
  check_not_registered(ptr, bytes);
  const uint32_t id = next_buffer_id_++;
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<ipc::wire::Request>().initRegisterBuffer();
  request.setBufferId(id);
  request.setOffset(offset);
  request.setBytes(bytes);
  set_memory(request);
  round_trip(message, fds);
  registered_.emplace(
      reinterpret_cast<uintptr_t>(ptr),
      Registered{static_cast<uint8_t*>(ptr), bytes, id, device, std::move(allocation_ids)});
}

void Communicator::set_stream(void* stream) {
  stream_ordered_ = true;
  stream_ = stream;
}

void Communicator::unset_stream() {
  stream_ordered_ = false;
  stream_ = nullptr;
}

uint32_t Communicator::acquire_event_slot() {
  if (!events_) {
    auto events = std::make_unique<StreamEvents>();
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<ipc::wire::Request>().initRegisterEvents();
    const std::vector<IpcEventHandle> ready = events->ready_handles();
    auto list = request.initReadyEvents(static_cast<unsigned>(ready.size()));
    for (unsigned i = 0; i < ready.size(); ++i) {
      list.set(i, kj::arrayPtr(ready[i].data(), ready[i].size()));
    }
    request.setDeviceUuid(kj::arrayPtr(events->device_uuid().data(), events->device_uuid().size()));
    ipc::DecodedMessage reply = round_trip(message);
    const auto root = reply.root<ipc::wire::Reply>();
    if (!root.isEvents()) throw Error(GRADSYNC_ERR_PROTOCOL, "register events: unexpected reply");
    std::vector<IpcEventHandle> completions;
    for (const capnp::Data::Reader handle : root.getEvents().getCompletionEvents()) {
      if (handle.size() != sizeof(IpcEventHandle)) {
        throw Error(GRADSYNC_ERR_PROTOCOL, "register events: a malformed completion event");
      }
      IpcEventHandle bytes{};
      std::copy(handle.begin(), handle.end(), bytes.begin());
      completions.push_back(bytes);
    }
    events->open_completions(completions);
    events_ = std::move(events);
  }
  std::optional<uint32_t> slot = events_->acquire();
  if (!slot) {
    // Every slot is in flight: the oldest completions free them.
    wait_until([&] { return (slot = events_->acquire()).has_value(); });
  }
  return *slot;
}

void Communicator::order_completion(uint64_t request, gradsync_result& status,
                                    std::string& message) {
  const auto it = ordered_.find(request);
  if (it == ordered_.end()) return;
  const Ordered ordered = it->second;
  ordered_.erase(it);
  try {
    if (status == GRADSYNC_OK) events_->wait_completion(ordered.slot, ordered.stream);
  } catch (const Error& e) {
    status = e.code();
    message = e.what();
  }
  events_->release(ordered.slot);
}

void Communicator::check_not_registered(const void* ptr, size_t bytes) const {
  const auto start = reinterpret_cast<uintptr_t>(ptr);
  auto next = registered_.lower_bound(start);
  const bool overlaps_next = next != registered_.end() && next->first < start + bytes;
  const bool overlaps_previous =
      next != registered_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > start;
  if (overlaps_next || overlaps_previous) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "register: range overlaps a registered buffer (double registration)");
  }
}

void Communicator::unregister(void* ptr) {
  const auto it = registered_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == registered_.end()) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "unregister: pointer is not a registered buffer");
  }
  capnp::MallocMessageBuilder message;
  message.initRoot<ipc::wire::Request>().initUnregisterBuffer().setBufferId(it->second.id);
  registered_.erase(it);
  round_trip(message);
}

const Communicator::Registered* Communicator::registered_range(const void* ptr,
                                                               uint64_t bytes) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  auto it = registered_.upper_bound(address);
  if (it == registered_.begin()) return nullptr;
  const Registered& range = std::prev(it)->second;
  return address - std::prev(it)->first + bytes <= range.bytes ? &range : nullptr;
}

const Communicator::Registered& Communicator::usable_range(const void* ptr, uint64_t bytes,
                                                           const char* what) {
  if (const Registered* range = registered_range(ptr, bytes)) return *range;
  for (const AttachedHeap& attached : attached_heaps_) {
    std::shared_ptr<const SharedHeap::Arena> arena = attached.heap->arena_of(ptr, bytes);
    if (!arena) continue;
    uint8_t* const base = arena->base();
    register_in_arena(base, arena->size(), *arena);
    Registered& range = registered_.at(reinterpret_cast<uintptr_t>(base));
    range.arena = std::move(arena);
    return range;
  }
  throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
              std::string(what) + " range is not inside one registered buffer");
}

void Communicator::attach_heap(std::shared_ptr<SharedHeap> heap) {
  if (!heap) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "attach heap: no heap");
  for (const AttachedHeap& attached : attached_heaps_) {
    if (attached.heap == heap) return;
  }
  const uint64_t releases = heap->releases();
  attached_heaps_.push_back(AttachedHeap{std::move(heap), releases});
}

void Communicator::forget_released_arenas() {
  bool any = false;
  for (AttachedHeap& attached : attached_heaps_) {
    const uint64_t releases = attached.heap->releases();
    any = any || releases != attached.releases_seen;
    attached.releases_seen = releases;
  }
  if (!any) return;
  std::vector<void*> released;
  for (const auto& [address, range] : registered_) {
    if (range.arena && range.arena->released()) released.push_back(range.base);
  }
  // A collective in flight on one holds the daemon's mapping of it until it is over: the
  // memory goes back once both sides have let go.
  for (void* base : released) unregister(base);
}

gradsync_request Communicator::submit(const CollectiveArgs& args) {
  if (daemon_gone_) throw Error(GRADSYNC_ERR_DAEMON_GONE, daemon_gone_reason_);
  ipc::SubmissionEntry entry{};
  entry.request = next_request_++;
  entry.collective = static_cast<uint8_t>(args.collective);
  entry.dtype = static_cast<uint8_t>(args.dtype);
  entry.op = static_cast<uint8_t>(args.op);
  entry.root = args.root;
  entry.priority = priority_;
  entry.count = args.count;
  std::string generated;
  const char* name = args.name;
  if (name == nullptr) {
    // One sequence for every kind: ranks whose n-th unnamed collectives differ in kind meet
    // under one name, and the daemon fails it with both kinds named, instead of each waiting
    // for the others' under names of its own.
    generated = ipc::kUnnamedPrefix + std::to_string(unnamed_sequence_++);
    name = generated.c_str();
  }
  const size_t name_length = std::strlen(name);
  if (name_length == 0 || name_length > ipc::kMaxTensorNameBytes) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "tensor name must be 1-" + std::to_string(ipc::kMaxTensorNameBytes) + " bytes");
  }
  std::memcpy(entry.name, name, name_length);
  entry.name_length = static_cast<uint32_t>(name_length);

  if (args.collective != ipc::Collective::kBarrier) {
    if (!ipc::parse_dtype(args.dtype)) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "unknown dtype");
    const auto op = ipc::parse_op(args.op);
    if (!op) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "unknown op");
    if (ipc::reduces(args.collective) && !ipc::op_reduces(*op, args.dtype)) {
      throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, std::string(ipc::op_name(*op)) +
                                                     " reduces integers only, not " +
                                                     ipc::dtype_name(args.dtype));
    }
    const auto range = ipc::checked_range_bytes(args.collective, args.count, args.dtype,
                                                static_cast<uint64_t>(options_.world_size));
    if (!range) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "count overflows the byte size");
    forget_released_arenas();
    const Registered& send = usable_range(args.send, range->send, "send");
    const Registered& recv = usable_range(args.recv, range->recv, "receive");
    entry.send_buffer = send.id;
    entry.send_offset = static_cast<const uint8_t*>(args.send) - send.base;
    entry.recv_buffer = recv.id;
    entry.recv_offset = static_cast<uint8_t*>(args.recv) - recv.base;
    for (const Registered* range : {&send, &recv}) {
      // The daemon maps the allocation that was registered: one freed since, its address
      // reused, would take the result instead of the new memory.
      for (const auto& [address, id] : range->allocation_ids) {
        if (id != 0 && device_allocation_id(address) != id) {
          throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                      "device buffer " + std::to_string(range->id) +
                          " was freed and its address allocated again since it was registered: "
                          "unregister it and register the new memory");
        }
      }
    }
    if (stream_ordered_ && send.device) {
      // After everything the stream was given so far: the data's writes included.
      const uint32_t slot = acquire_event_slot();
      try {
        events_->record_ready(slot, stream_);
      } catch (const Error&) {
        events_->release(slot);
        throw;
      }
      entry.flags |= ipc::kFlagStreamOrdered;
      entry.event_slot = slot;
      ordered_.emplace(entry.request, Ordered{slot, stream_});
    }
  }
  requests_.add(entry.request);
  if (grouping_) {
    entry.flags |= ipc::kFlagGrouped;
    entry.group = next_group_;
    group_.push_back(entry);
  } else {
    push(entry);
  }
  return entry.request;
}

void Communicator::group_start() {
  if (grouping_) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "groups do not nest");
  grouping_ = true;
}

void Communicator::group_end() {
  if (!grouping_) throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "group_end without group_start");
  grouping_ = false;
  ++next_group_;
  for (auto& entry : group_) {
    entry.group_size = static_cast<uint32_t>(group_.size());
    push(entry);
  }
  group_.clear();
}

void Communicator::push(const ipc::SubmissionEntry& entry) {
  // At most one ring's worth in flight, so the daemon always has room for our completions.
  if (in_flight_ >= submissions_.capacity()) {
    wait_until([this] { return in_flight_ < submissions_.capacity(); });
  }
  // Published before the look at the flag (the daemon raises the flag, then looks at the
  // ring): one of the two sides sees the other.
  submissions_.try_push(entry, ipc::used_bytes(entry), std::memory_order_seq_cst);
  ++in_flight_;
  // The first submission to find the daemon asleep takes the flag down as it rings: the rest
  // of a burst, published before the daemon gets a core to wake on, ring no more.
  std::atomic<uint32_t>& sleeping = view_.header->daemon_sleeping;
  if (sleeping.load(std::memory_order_seq_cst) != 0 &&
      sleeping.exchange(0, std::memory_order_seq_cst) != 0) {
    ipc::eventfd_signal(doorbell_.get());
  }
}

void Communicator::drain_completions() {
  ipc::CompletionEntry& entry = completion_;
  while (completions_.try_pop(entry)) {
    if (in_flight_ > 0) --in_flight_;
    const size_t length = std::min<size_t>(entry.message_length, ipc::kMaxErrorMessageBytes);
    auto status = static_cast<gradsync_result>(entry.status);
    const std::string_view message(entry.message, length);
    if (ordered_.empty()) {
      requests_.finish(entry.request, status, message);  // ignored if abandoned
      continue;
    }
    std::string ordered_message(message);
    order_completion(entry.request, status, ordered_message);  // frees its slot
    requests_.finish(entry.request, status, ordered_message);
  }
}

void Communicator::check_daemon_alive() {
  struct pollfd pfd {
    socket_.get(), POLLIN, 0
  };
  if (::poll(&pfd, 1, 0) <= 0) return;
  // The daemon never speaks unasked: anything readable now is the connection closing.
  char byte = 0;
  const ssize_t n = ::recv(socket_.get(), &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  if (n == 0 || (n < 0 && errno != EAGAIN)) {
    daemon_gone_ = true;
    daemon_gone_reason_ = "gradsyncd closed the connection";
  }
}

template <typename Predicate>
bool Communicator::wait_until(Predicate done, std::optional<Clock::time_point> deadline) {
  // The spin's deadline is read when first needed: most waits after a burst of submissions
  // find their request done, and read no clock.
  std::optional<Clock::time_point> spin_until;
  if (done()) return true;  // most waits after a burst: an earlier wait drained their completion
  while (true) {
    drain_completions();
    if (done()) return true;
    if (daemon_gone_) throw Error(GRADSYNC_ERR_DAEMON_GONE, daemon_gone_reason_);
    const auto now = Clock::now();
    if (deadline && now >= *deadline) return false;
    if (!spin_until) spin_until = now + spin_;
    if (now < *spin_until) {
      sched_yield();
      continue;
    }
    int64_t sleep_ns = kLivenessCheckNs;
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - now);
      sleep_ns = std::min<int64_t>(sleep_ns, std::max<int64_t>(left.count(), 1));
    }
    ipc::SegmentHeader& header = *view_.header;
    const uint32_t sequence = header.completion_sequence.load(std::memory_order_seq_cst);
    // The daemon publishes, moves the sequence, then takes the flag down
    // (Session::wake_if_owed): read before the flag goes up, the sequence has moved by the
    // time the futex compares it unless the daemon will see the flag and wake us.
    header.client_waiting.store(1, std::memory_order_seq_cst);
    if (completions_.available() == 0) {
      if (!ipc::futex_wait(&header.completion_sequence, sequence, sleep_ns)) {
        check_daemon_alive();
      }
    }
    header.client_waiting.store(0, std::memory_order_relaxed);
  }
}

gradsync_result Communicator::take(gradsync_request request, std::string* message) {
  RequestTable::Outcome outcome = requests_.take(request);
  if (message != nullptr) *message = std::move(outcome.message);
  return outcome.status;
}

gradsync_result Communicator::wait(gradsync_request request, std::string* message) {
  if (requests_.state(request) == RequestTable::State::kUnknown) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "unknown or already consumed request");
  }
  if (grouping_ && !requests_.finished(request)) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "wait inside a group: call gradsync_group_end first");
  }
  try {
    wait_until([&] { return requests_.finished(request); });
  } catch (const Error&) {
    requests_.abandon(request);
    throw;
  }
  return take(request, message);
}

gradsync_result Communicator::wait_until_deadline(gradsync_request request,
                                                  Clock::time_point deadline,
                                                  std::string* message) {
  if (requests_.state(request) == RequestTable::State::kUnknown) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "unknown or already consumed request");
  }
  if (grouping_ && !requests_.finished(request)) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT,
                "wait inside a group: call gradsync_group_end first");
  }
  bool finished = false;
  try {
    finished = wait_until([&] { return requests_.finished(request); }, deadline);
  } catch (const Error&) {
    requests_.abandon(request);
    throw;
  }
  if (!finished) return GRADSYNC_IN_PROGRESS;
  return take(request, message);
}

gradsync_result Communicator::test(gradsync_request request, std::string* message) {
  if (requests_.state(request) == RequestTable::State::kUnknown) {
    throw Error(GRADSYNC_ERR_INVALID_ARGUMENT, "unknown or already consumed request");
  }
  drain_completions();
  if (!requests_.finished(request)) {
    // A caller polling with test() learns of a dead daemon as a waiter would, within the same
    // bound, without a system call on every poll.
    const auto now = Clock::now();
    if (now - last_liveness_check_ >= std::chrono::nanoseconds(kLivenessCheckNs)) {
      last_liveness_check_ = now;
      check_daemon_alive();
    }
    if (daemon_gone_) {
      requests_.abandon(request);
      throw Error(GRADSYNC_ERR_DAEMON_GONE, daemon_gone_reason_);
    }
    return GRADSYNC_IN_PROGRESS;
  }
  return take(request, message);
}

}  // namespace gradsync::client
