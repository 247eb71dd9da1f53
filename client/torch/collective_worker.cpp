#include "client/torch/collective_worker.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace gradsync::torch_backend {
namespace {

// How long the worker waits for the oldest task before it looks for newly queued ones; with
// several lanes busy, the shorter slice, on each lane's oldest in turn.
constexpr std::chrono::milliseconds kWaitSlice{5};
constexpr std::chrono::milliseconds kLaneWaitSlice{1};

std::exception_ptr call_error(const std::string& call, const std::exception& error) {
  return std::make_exception_ptr(
      std::runtime_error(std::string("gradsync: ") + call + " failed: " + error.what()));
}

// The group's settings for its pairs' jobs, which name their own parent (pair_settings): the
// caller's parent_ranks only live while the group connects.
gradsync_job_settings without_parent(gradsync_job_settings settings) {
  std::memset(settings.parent_job, 0, sizeof(settings.parent_job));
  settings.parent_ranks = nullptr;
  return settings;
}

}  // namespace

CollectiveWorker::Lane::Lane(const gradsync_options& options, const gradsync_job_settings& settings,
                             const gradsync::Heap& tensor_heap)
    : comm(options, settings), staging(comm) {
  comm.attach(tensor_heap);
}

CollectiveWorker::CollectiveWorker(const gradsync_options& options,
                                   const gradsync_job_settings& settings, GroupLayout layout,
                                   const gradsync::Heap& tensor_heap)
    : options_(options),
      settings_(without_parent(settings)),
      layout_(std::move(layout)),
      tensor_heap_(tensor_heap),
      group_(options, settings, tensor_heap) {
  thread_ = std::thread([this] { run(); });
}

CollectiveWorker::~CollectiveWorker() {
  stop();
}

void CollectiveWorker::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWorker::enqueue(Task task) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      queue_.push_back(std::move(task));
      queued_.notify_one();
      return;
    }
  }
  task.work->fail(std::make_exception_ptr(std::runtime_error(
      "gradsync: " + task.call + " after its process group was shut down (the process exits)")));
}

void CollectiveWorker::run() {
  // Results are written into the caller's tensors as Gloo and NCCL write them, beneath
  // autograd: a parameter that requires grad may be broadcast into.
  const at::NoGradGuard no_grad;
  std::vector<Lane*> busy;
  size_t rounds = 0;
  while (true) {
    std::deque<Task> fresh;
    {
      std::unique_lock lock(mutex_);
      if (idle()) {
        queued_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to do
      }
      fresh.swap(queue_);
    }
    for (Task& task : fresh) start(std::move(task));
    busy.clear();
    if (!group_.in_flight.empty()) busy.push_back(&group_);
    for (auto& [peer, lane] : pairs_) {
      if (!lane->in_flight.empty()) busy.push_back(lane.get());
    }
    // One wait of a slice a round, on each busy lane in turn; the others' oldest are only
    // looked at, so that a round takes one slice however many peers are busy.
    const std::chrono::milliseconds slice = busy.size() > 1 ? kLaneWaitSlice : kWaitSlice;
    const size_t waiting = busy.empty() ? 0 : rounds++ % busy.size();
    for (size_t i = 0; i < busy.size(); ++i) {
      Lane& lane = *busy[i];
      if (progress(lane, lane.in_flight.front(),
                   i == waiting ? slice : std::chrono::milliseconds(0))) {
        finish(lane, lane.in_flight.front());
        lane.in_flight.pop_front();
      }
    }
  }
}

bool CollectiveWorker::idle() const {
  return group_.in_flight.empty() &&
         std::all_of(pairs_.begin(), pairs_.end(),
                     [](const auto& pair) { return pair.second->in_flight.empty(); });
}

CollectiveWorker::Lane* CollectiveWorker::lane_for(Task& task) {
  if (task.peer < 0) return &group_;
  try {
    return &pair_lane(task.peer);
  } catch (const std::exception& error) {
    task.work->fail(std::make_exception_ptr(std::runtime_error(
        "gradsync: " + task.call + " cannot join the job of the pair: " + error.what())));
    return nullptr;
  }
}

CollectiveWorker::Lane& CollectiveWorker::pair_lane(int peer) {
  auto it = pairs_.find(peer);
  if (it == pairs_.end()) {
    const PairRanks ranks = pair_ranks(options_.rank, peer);
    auto lane = std::make_unique<Lane>(pair_options(options_, layout_, peer),
                                       pair_settings(settings_, options_, ranks), tensor_heap_);
    it = pairs_.emplace(peer, std::move(lane)).first;
  }
  return *it->second;
}

void CollectiveWorker::run_in_pairs(InFlight& flight) {
  // One flight per message, each submitted alone: a send and a receive between the same two
  // ranks are two names the daemon matches, never one group.
  struct Part {
    Lane* lane;
    InFlight flight;
  };
  std::vector<Part> parts;
  for (Transfer& transfer : flight.task.transfers) {
    Part& part = parts.emplace_back();
    part.flight.deadline = flight.deadline;
    part.flight.task.call = flight.task.call;
    part.flight.task.device = flight.task.device;
    part.flight.task.timeout = flight.task.timeout;
    part.flight.task.priority = flight.task.priority;
    const int peer = transfer.peer;
    part.flight.task.transfers.push_back(std::move(transfer));
    try {
      part.lane = peer < 0 ? &group_ : &pair_lane(peer);
    } catch (const std::exception& error) {
      part.lane = nullptr;
      part.flight.error = call_error(flight.task.call, error);
      continue;
    }
    submit(*part.lane, part.flight);
  }
  flight.task.transfers.clear();
  // Every message over before any result is written out: an output may overlap an input that
  // a later message still reads.
  for (Part& part : parts) {
    if (part.lane == nullptr) continue;
    while (!progress(*part.lane, part.flight, kWaitSlice)) {
    }
  }
  for (Part& part : parts) {
    if (part.lane != nullptr) deliver(*part.lane, part.flight);
    if (part.flight.error && !flight.error) flight.error = part.flight.error;
  }
}

std::optional<c10::Stream> CollectiveWorker::stream_for(c10::Device device) {
  if (device.is_cpu()) return std::nullopt;
  auto it = streams_.find(device.index());
  if (it == streams_.end()) {
    // A stream of its own rather than the device's default, which would wait for (and hold
    // up) the work of every other stream of the process.
    const c10::impl::VirtualGuardImpl guard_impl(device.type());
    it = streams_.emplace(device.index(), guard_impl.getStreamFromGlobalPool(device)).first;
  }
  return it->second;
}

void CollectiveWorker::start(Task task) {
  if (broken_) {
    task.work->fail(broken_);
    return;
  }
  Lane* const lane = lane_for(task);
  if (lane == nullptr) return;
  InFlight flight;
  flight.deadline = std::chrono::steady_clock::now() + task.timeout;
  flight.task = std::move(task);
  submit(*lane, flight);
  if (flight.task.then) {
    // The first stage to its end here: the second one's transfers depend on its results.
    while (!progress(*lane, flight, kWaitSlice)) {
    }
    deliver(*lane, flight);
    if (!flight.error) {
      try {
        flight.task.transfers = flight.task.then();
      } catch (const std::exception& error) {
        flight.error = call_error(flight.task.call, error);
      }
    }
    flight.requests.clear();
    flight.finished = 0;
    const bool in_pairs = std::any_of(flight.task.transfers.begin(), flight.task.transfers.end(),
                                      [](const Transfer& transfer) { return transfer.peer >= 0; });
    if (flight.error) {
      flight.task.transfers.clear();
    } else if (in_pairs) {
      run_in_pairs(flight);  // over once it returns: the task completes in its turn below
    } else {
      submit(*lane, flight);
    }
  }
  lane->in_flight.push_back(std::move(flight));
}

void CollectiveWorker::submit(Lane& lane, InFlight& flight) {
  const Task& task = flight.task;
  bool grouping = false;  // between group_start and group_end
  try {
    gradsync::Communicator& comm = lane.comm;
    if (task.priority != lane.priority) {
      comm.set_priority(task.priority);
      lane.priority = task.priority;
    }
    // On a GPU: the copies in wait on the device for what the caller's stream was given before
    // the call, and are finished before the daemon reads them.
    const std::optional<c10::Stream> stream = stream_for(task.device);
    std::optional<c10::StreamGuard> on_stream;
    if (stream) on_stream.emplace(*stream);
    if (stream && task.inputs_ready) task.inputs_ready->block(*stream);
    for (const Transfer& transfer : task.transfers) {
      const c10::Device device = transfer.on_host ? c10::Device(c10::kCPU) : task.device;
      const size_t staged = transfer.staged_bytes();
      StagingBuffer& buffer = flight.staging.emplace_back(
          staged == 0 ? StagingBuffer(SharedBuffer()) : lane.staging.acquire(staged, device));
      staged_bytes_.fetch_add(staged, std::memory_order_relaxed);
      if (transfer.fill) transfer.fill(transfer.regions(buffer.data()).send);
    }
    if (stream) stream->synchronize();
    if (task.transfers.size() > 1) {
      comm.group_start();
      grouping = true;
    }
    for (size_t i = 0; i < task.transfers.size(); ++i) {
      const Transfer& transfer = task.transfers[i];
      const auto [send, recv] = transfer.regions(flight.staging[i].data());
      const char* const name = transfer.name.empty() ? nullptr : transfer.name.c_str();
      switch (transfer.kind) {
        case TransferKind::kAllreduce:
          flight.requests.push_back(
              comm.allreduce(name, send, recv, transfer.count, transfer.dtype, transfer.op));
          break;
        case TransferKind::kBroadcast:
          flight.requests.push_back(
              comm.broadcast(name, send, recv, transfer.count, transfer.dtype, transfer.root));
          break;
        case TransferKind::kAllgather:
          flight.requests.push_back(
              comm.allgather(name, send, recv, transfer.count, transfer.dtype));
          break;
        case TransferKind::kReduceScatter:
          flight.requests.push_back(
              comm.reduce_scatter(name, send, recv, transfer.count, transfer.dtype, transfer.op));
          break;
        case TransferKind::kAllToAll:
          flight.requests.push_back(
              comm.alltoall(name, send, recv, transfer.count, transfer.dtype));
          break;
        case TransferKind::kBarrier:
          flight.requests.push_back(comm.barrier_async());
          break;
        case TransferKind::kLocal:
          break;  // copied by its fill above
      }
    }
    if (grouping) {
      grouping = false;
      comm.group_end();
    }
  } catch (const std::exception& error) {
    // Requests submitted before the failure are still waited for (their memory is in use).
    flight.error = call_error(task.call, error);
    if (grouping) gradsync_group_end(lane.comm.get());
  }
}

std::string CollectiveWorker::waiting_for(Lane& lane) {
  try {
    const std::string waiting = lane.comm.waiting_for();
    return waiting.empty() ? std::string() : "; the daemon: " + waiting;
  } catch (const std::exception& error) {  // the answer would only have helped
    return std::string("; the daemon could not say what the job waits for: ") + error.what();
  }
}

bool CollectiveWorker::progress(Lane& lane, InFlight& oldest, std::chrono::milliseconds slice) {
  while (oldest.finished < oldest.requests.size()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= oldest.deadline) {
      const auto timeout = oldest.task.timeout.count();
      oldest.error = std::make_exception_ptr(std::runtime_error(
          "gradsync: " + oldest.task.call + " timed out after " + std::to_string(timeout) +
          " ms (the process group's timeout)" + waiting_for(lane)));
      broken_ = std::make_exception_ptr(std::runtime_error(
          "gradsync: an earlier " + oldest.task.call + " timed out after " +
          std::to_string(timeout) + " ms; this process group cannot run collectives any more"));
      for (StagingBuffer& buffer : oldest.staging) lane.abandoned.push_back(std::move(buffer));
      oldest.staging.clear();
      // Tensors it ran on in place likewise: their memory must not serve another tensor.
      for (Transfer& transfer : oldest.task.transfers) {
        for (at::Tensor& tensor : transfer.direct_tensors) {
          lane.abandoned_tensors.push_back(std::move(tensor));
        }
      }
      return true;
    }
    const auto wait = std::min<std::chrono::milliseconds>(
        slice, std::chrono::ceil<std::chrono::milliseconds>(oldest.deadline - now));
    try {
      if (!lane.comm.wait_for(oldest.requests[oldest.finished], wait)) return false;
    } catch (const std::exception& error) {
      if (!oldest.error) oldest.error = call_error(oldest.task.call, error);
    }
    ++oldest.finished;
  }
  return true;
}

void CollectiveWorker::deliver(Lane& lane, InFlight& done) {
  // On a GPU the copies out are finished before the Work completes (and its future records
  // its events on this stream, where nothing is left to wait for).
  const std::optional<c10::Stream> stream = stream_for(done.task.device);
  std::optional<c10::StreamGuard> on_stream;
  if (stream) on_stream.emplace(*stream);
  try {
    if (!done.error) {
      for (size_t i = 0; i < done.task.transfers.size(); ++i) {
        const Transfer& transfer = done.task.transfers[i];
        if (transfer.deliver) transfer.deliver(transfer.regions(done.staging[i].data()).recv);
      }
    }
    // Also after a failure: a copy in that a failure cut short must not still read the
    // caller's tensors once the task lets them go.
    if (stream) stream->synchronize();
  } catch (const std::exception& error) {
    if (!done.error) done.error = call_error(done.task.call, error);
  }
  for (StagingBuffer& buffer : done.staging) {
    if (buffer.size() != 0) lane.staging.release(std::move(buffer));
  }
  done.staging.clear();
}

void CollectiveWorker::finish(Lane& lane, InFlight& done) {
  deliver(lane, done);
  if (done.error) {
    done.task.work->fail(done.error);
  } else {
    done.task.work->complete();
  }
}

}  // namespace gradsync::torch_backend
