// The thread that owns a process group's communicator. A gradsync communicator is used by one
// thread at a time, and DDP needs its futures completed while the training thread goes on: so
// the process group queues each call here as a Task; the worker stages its tensors into
// registered memory (shared host memory, or device memory for CUDA tensors) unless they lie in
// gradsync's shared memory already, submits it, waits for it, copies the results out and
// completes its Work.
//
// On a GPU the daemon's collectives are host-synchronous: the worker's copies in are finished
// before it submits, the daemon's work is finished when the wait returns, and the copies out
// are finished before the Work completes. So a completed Work's tensors hold the result for any
// stream, and the caller's stream never waits on another process's event (which costs a
// switch between the processes' contexts without MPS: docs/cuda.md).
//
// Point-to-point calls run on communicators of their own, one per peer (point_to_point.h), each
// a lane of the worker with its own tasks in flight: a receive that waits for its sender holds
// up neither the group's collectives nor messages to and from other peers.
//
// The worker waits for the oldest task of each busy lane in short slices, looking for newly
// queued tasks between them, so a call queued while another is in flight is submitted within
// one slice. A task with a second stage (Task::then) holds the worker until its first stage is
// over.
#pragma once

#include "client/torch/point_to_point.h"
#include "client/torch/staging.h"
#include "client/torch/work.h"

#include <gradsync/gradsync.hpp>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gradsync::torch_backend {

enum class TransferKind {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kLocal,  // no collective: `fill` copies on this rank alone (its staging region unused)
};

// One gradsync collective of a task, on staging memory on the task's device: the receive region
// first, then the send region (none when in place). A region whose tensor already lies in memory
// the communicator can use (gradsync's shared memory allocator) is not staged: the collective
// runs on the tensor itself.
struct Transfer {
  TransferKind kind = TransferKind::kBarrier;
  size_t send_bytes = 0;
  size_t recv_bytes = 0;  // 0: in place, the result lands in the send region
  size_t count = 0;  // elements of `dtype` each rank sends (reduce-scatter, all-to-all: to each)
  gradsync_dtype dtype = GRADSYNC_INT32;
  gradsync_op op = GRADSYNC_SUM;
  int32_t root = 0;
  // The name every rank submits it under (a point-to-point message's); empty: unnamed, matched
  // by its place among the communicator's unnamed collectives.
  std::string name;
  // In a task's second stage (Task::then): the group rank whose pair's job it runs in, as a
  // message (point_to_point.h); -1: the task's own communicator.
  int peer = -1;
  std::function<void(std::byte* send)> fill;           // copies the input in
  std::function<void(const std::byte* recv)> deliver;  // copies the result out
  // Staged in host memory whatever the task's device (a table of sizes the host reads).
  bool on_host = false;
  // The tensors' own memory, where they are not staged: then `fill` (for the send region) or
  // `deliver` (for the receive region; in place, for both) is left empty.
  std::byte* direct_send = nullptr;
  std::byte* direct_recv = nullptr;
  std::vector<at::Tensor> direct_tensors;  // held until the collective is over
  // Bytes of staging memory the transfer needs.
  size_t staged_bytes() const {
    return (direct_recv != nullptr ? 0 : recv_bytes) + (direct_send != nullptr ? 0 : send_bytes);
  }
  // Where the collective reads and writes, its staging memory at `staged`.
  struct Regions {
    std::byte* send;
    std::byte* recv;
  };
  Regions regions(std::byte* staged) const {
    std::byte* const send = direct_send != nullptr   ? direct_send
                            : direct_recv != nullptr ? staged
                                                     : staged + recv_bytes;
    if (recv_bytes == 0) return {send, send};
    return {send, direct_recv != nullptr ? direct_recv : staged};
  }
};

struct Task {
  std::string call;                 // the ProcessGroup call (and its peer), for errors
  std::vector<Transfer> transfers;  // submitted as one group when more than one
  c10::intrusive_ptr<GradsyncWork> work;
  std::chrono::milliseconds timeout{0};
  int32_t priority = 0;  // gradsync_set_priority's
  // The group rank a point-to-point call exchanges with; -1 for the group's collectives.
  int peer = -1;
  // Where every tensor of the call lies: the host, or one GPU. On a GPU, the copies in and out
  // run on a stream of the worker's that first waits for `inputs_ready`, recorded on the
  // caller's stream when the call was made.
  c10::Device device{c10::kCPU};
  std::unique_ptr<c10::Event> inputs_ready;
  // A second stage, for a call whose sizes every rank must learn first (an all-to-all of uneven
  // blocks): once `transfers` are delivered, the worker calls `then` and runs the transfers it
  // returns as the task's own, before it starts any later task, so every rank submits them in
  // the same place among its collectives. An exception from it fails the task. Transfers it
  // returns with a peer run as messages in their pairs' jobs, all waited for there and then.
  std::function<std::vector<Transfer>()> then;
};

class CollectiveWorker {
 public:
  // Collectives may run on `tensor_heap`'s memory in place (Transfer::direct_send). `layout`
  // says where the group's ranks run, for the jobs of point-to-point calls.
  CollectiveWorker(const gradsync_options& options, const gradsync_job_settings& settings,
                   GroupLayout layout, const gradsync::Heap& tensor_heap);
  // Runs every queued task to its end, then disconnects.
  ~CollectiveWorker();
  CollectiveWorker(const CollectiveWorker&) = delete;
  CollectiveWorker& operator=(const CollectiveWorker&) = delete;

  // Queues a task; once the worker is stopping, fails it at once.
  void enqueue(Task task);
  // Runs every queued task to its end and stops the thread (idempotent): what the process
  // group runs before the interpreter shuts down, while the thread may still take the GIL.
  void stop();
  // Bytes of staging memory the calls so far were copied through (a diagnostic: a call whose
  // tensors lie in gradsync's shared memory adds none).
  uint64_t staged_bytes() const { return staged_bytes_.load(std::memory_order_relaxed); }

 private:
  struct InFlight {
    Task task;
    std::vector<StagingBuffer> staging;  // one per transfer
    std::vector<gradsync_request> requests;
    size_t finished = 0;  // requests waited for, in order
    std::chrono::steady_clock::time_point deadline;
    std::exception_ptr error;
  };

  // A communicator and what the worker runs on it: the group's own, or a pair job's.
  struct Lane {
    Lane(const gradsync_options& options, const gradsync_job_settings& settings,
         const gradsync::Heap& tensor_heap);

    gradsync::Communicator comm;
    StagingPool staging;
    std::deque<InFlight> in_flight;  // submitted, completed in order
    int32_t priority = 0;            // the communicator's
    // Of timed-out collectives, which the daemon may still write: kept to the end.
    std::vector<StagingBuffer> abandoned;
    std::vector<at::Tensor> abandoned_tensors;
  };

  void run();
  bool idle() const;
  void start(Task task);
  // The lane a task runs on, connected on first use; null (and the task failed) where its pair
  // job cannot be joined.
  Lane* lane_for(Task& task);
  // The lane of the pair of this rank and `peer`, connected on first use (throws where it
  // cannot be).
  Lane& pair_lane(int peer);
  // Runs the transfers of `flight`'s second stage that name a peer as messages in their pairs'
  // jobs (and the others on the group's), and waits for all of them; failures land in
  // flight.error.
  void run_in_pairs(InFlight& flight);
  // Stages and submits `flight.task`'s transfers; a failure lands in flight.error.
  void submit(Lane& lane, InFlight& flight);
  // Copies the results of a flight whose requests are over out of its staging, and releases it.
  void deliver(Lane& lane, InFlight& done);
  // Waits up to `slice` for the lane's oldest task: true once it is over.
  bool progress(Lane& lane, InFlight& oldest, std::chrono::milliseconds slice);
  // What the lane's job waits for as its daemon says, for a timeout's message ("; the daemon:
  // ..."; empty where nothing waits).
  static std::string waiting_for(Lane& lane);
  void finish(Lane& lane, InFlight& done);
  // The stream the worker copies to and from `device` on (none for the host).
  std::optional<c10::Stream> stream_for(c10::Device device);

  const gradsync_options options_;
  const gradsync_job_settings settings_;
  const GroupLayout layout_;
  const gradsync::Heap& tensor_heap_;
  Lane group_;
  std::map<int, std::unique_ptr<Lane>> pairs_;  // by peer

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Task> queue_;
  bool stopping_ = false;

  // The worker thread's own.
  std::exception_ptr broken_;  // once a collective timed out, its successors cannot run
  std::map<c10::DeviceIndex, c10::Stream> streams_;  // per GPU, from PyTorch's pool
  std::atomic<uint64_t> staged_bytes_{0};
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace gradsync::torch_backend
