#include "client/torch/collective_worker.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace gradsync::torch_backend {
namespace {

// How long the worker waits for the oldest task before it looks for newly queued ones.
constexpr std::chrono::milliseconds kWaitSlice{5};

std::exception_ptr call_error(const char* call, const std::exception& error) {
  return std::make_exception_ptr(
      std::runtime_error(std::string("gradsync: ") + call + " failed: " + error.what()));
}

}  // namespace

CollectiveWorker::CollectiveWorker(const gradsync_options& options,
                                   const gradsync_job_settings& settings,
                                   const gradsync::Heap& tensor_heap)
    : comm_(options, settings), staging_(comm_) {
  comm_.attach(tensor_heap);
  thread_ = std::thread([this] { run(); });
}

CollectiveWorker::~CollectiveWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_one();
  thread_.join();
}

void CollectiveWorker::enqueue(Task task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
  }
  queued_.notify_one();
}

void CollectiveWorker::run() {
  // Results are written into the caller's tensors as Gloo and NCCL write them, beneath
  // autograd: a parameter that requires grad may be broadcast into.
  const at::NoGradGuard no_grad;
  while (true) {
    std::deque<Task> fresh;
    {
      std::unique_lock lock(mutex_);
      if (in_flight_.empty()) {
        queued_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left to do
      }
      fresh.swap(queue_);
    }
    for (Task& task : fresh) start(std::move(task));
    if (!in_flight_.empty() && progress(in_flight_.front())) {
      finish(in_flight_.front());
      in_flight_.pop_front();
    }
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
  InFlight flight;
  flight.deadline = std::chrono::steady_clock::now() + task.timeout;
  flight.task = std::move(task);
  submit(flight);
  if (flight.task.then) {
    // The first stage to its end here: the second one's transfers depend on its results.
    while (!progress(flight)) {
    }
    deliver(flight);
    if (!flight.error) {
      try {
        flight.task.transfers = flight.task.then();
      } catch (const std::exception& error) {
        flight.error = call_error(flight.task.call, error);
      }
    }
    flight.requests.clear();
    flight.finished = 0;
    if (!flight.error) submit(flight);
  }
  in_flight_.push_back(std::move(flight));
}

void CollectiveWorker::submit(InFlight& flight) {
  const Task& task = flight.task;
  bool grouping = false;  // between group_start and group_end
  try {
    if (task.priority != priority_) {
      comm_.set_priority(task.priority);
      priority_ = task.priority;
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
          staged == 0 ? StagingBuffer(SharedBuffer()) : staging_.acquire(staged, device));
      staged_bytes_.fetch_add(staged, std::memory_order_relaxed);
      if (transfer.fill) transfer.fill(transfer.regions(buffer.data()).send);
    }
    if (stream) stream->synchronize();
    if (task.transfers.size() > 1) {
      comm_.group_start();
      grouping = true;
    }
    for (size_t i = 0; i < task.transfers.size(); ++i) {
      const Transfer& transfer = task.transfers[i];
      const auto [send, recv] = transfer.regions(flight.staging[i].data());
      switch (transfer.kind) {
        case TransferKind::kAllreduce:
          flight.requests.push_back(
              comm_.allreduce(nullptr, send, recv, transfer.count, transfer.dtype, transfer.op));
          break;
        case TransferKind::kBroadcast:
          flight.requests.push_back(
              comm_.broadcast(nullptr, send, recv, transfer.count, transfer.dtype, transfer.root));
          break;
        case TransferKind::kAllgather:
          flight.requests.push_back(
              comm_.allgather(nullptr, send, recv, transfer.count, transfer.dtype));
          break;
        case TransferKind::kReduceScatter:
          flight.requests.push_back(comm_.reduce_scatter(nullptr, send, recv, transfer.count,
                                                         transfer.dtype, transfer.op));
          break;
        case TransferKind::kAllToAll:
          flight.requests.push_back(
              comm_.alltoall(nullptr, send, recv, transfer.count, transfer.dtype));
          break;
        case TransferKind::kBarrier:
          flight.requests.push_back(comm_.barrier_async());
          break;
      }
    }
    if (grouping) {
      grouping = false;
      comm_.group_end();
    }
  } catch (const std::exception& error) {
    // Requests submitted before the failure are still waited for (their memory is in use).
    flight.error = call_error(task.call, error);
    if (grouping) gradsync_group_end(comm_.get());
  }
}

bool CollectiveWorker::progress(InFlight& oldest) {
  while (oldest.finished < oldest.requests.size()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= oldest.deadline) {
      const auto timeout = oldest.task.timeout.count();
      oldest.error = std::make_exception_ptr(
          std::runtime_error(std::string("gradsync: ") + oldest.task.call + " timed out after " +
                             std::to_string(timeout) + " ms (the process group's timeout)"));
      broken_ = std::make_exception_ptr(std::runtime_error(
          std::string("gradsync: an earlier ") + oldest.task.call + " timed out after " +
          std::to_string(timeout) + " ms; this process group cannot run collectives any more"));
      for (StagingBuffer& buffer : oldest.staging) abandoned_.push_back(std::move(buffer));
      oldest.staging.clear();
      // Tensors it ran on in place likewise: their memory must not serve another tensor.
      for (Transfer& transfer : oldest.task.transfers) {
        for (at::Tensor& tensor : transfer.direct_tensors) {
          abandoned_tensors_.push_back(std::move(tensor));
        }
      }
      return true;
    }
    const auto slice = std::min<std::chrono::milliseconds>(
        kWaitSlice, std::chrono::ceil<std::chrono::milliseconds>(oldest.deadline - now));
    try {
      if (!comm_.wait_for(oldest.requests[oldest.finished], slice)) return false;
    } catch (const std::exception& error) {
      if (!oldest.error) oldest.error = call_error(oldest.task.call, error);
    }
    ++oldest.finished;
  }
  return true;
}

void CollectiveWorker::deliver(InFlight& done) {
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
    if (buffer.size() != 0) staging_.release(std::move(buffer));
  }
  done.staging.clear();
}

void CollectiveWorker::finish(InFlight& done) {
  deliver(done);
  if (done.error) {
    done.task.work->fail(done.error);
  } else {
    done.task.work->complete();
  }
}

}  // namespace gradsync::torch_backend
