// torch.distributed's backend "gradsync": a c10d::ProcessGroup whose collectives run in the
// node's gradsyncd. Each process group (the default one and every dist.new_group) is a job of
// its own in the daemon, as each is a communicator of its own in NCCL; the Python package
// agrees on its name, ranks and nodes through the group's store (gradsync/torch.py).
//
// Host (CPU) and CUDA tensors; the calls gradsync has no collective for yet are composed from
// those it has (docs/python.md says which, and at what cost).
#pragma once

#include "client/torch/collective_worker.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gradsync::torch_backend {

class ProcessGroupGradsync : public c10d::ProcessGroup {
 public:
  // Connects as `options.rank` of `options.job`; `timeout` bounds every collective. `layout`
  // says where the group's ranks run (for the jobs of point-to-point calls).
  ProcessGroupGradsync(const gradsync_options& options, const gradsync_job_settings& settings,
                       GroupLayout layout, std::chrono::milliseconds timeout);
  // Runs what is queued to its end, without the GIL (see the definition).
  ~ProcessGroupGradsync() override;
  ProcessGroupGradsync(const ProcessGroupGradsync&) = delete;
  ProcessGroupGradsync& operator=(const ProcessGroupGradsync&) = delete;

  const std::string getBackendName() const override { return "gradsync"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // Point-to-point (point_to_point.h); a receive names its source: no recvAnysource.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;

  // The priority of the collectives called from now on (gradsync_set_priority); the Python
  // package's gradsync.torch.priority sets it around calls.
  void set_priority(int32_t priority) { priority_ = priority; }
  int32_t priority() const { return priority_; }
  // Runs what is queued to its end and stops the worker; later calls fail. The Python package
  // calls it as the interpreter exits, before the worker could no longer take the GIL.
  void shutdown() { worker_->stop(); }
  // Bytes of staging memory this group's calls were copied through so far.
  uint64_t staged_bytes() const { return worker_->staged_bytes(); }

 private:
  // Queues the transfers as one call, with a second stage where `then` is given (Task::then);
  // its Work completes with `outputs`.
  c10::intrusive_ptr<c10d::Work> run(std::string call, c10d::OpType type, c10::Device device,
                                     std::vector<Transfer> transfers,
                                     std::vector<at::Tensor> outputs,
                                     std::chrono::milliseconds timeout,
                                     std::function<std::vector<Transfer>()> then = {},
                                     int peer = -1);
  // A send (`sending`) or receive of the one tensor of `tensors` between this rank and `peer`.
  c10::intrusive_ptr<c10d::Work> exchange(const char* call, std::vector<at::Tensor>& tensors,
                                          int peer, int tag, bool sending);
  std::chrono::milliseconds bound(std::chrono::milliseconds requested) const;

  std::chrono::milliseconds timeout_;
  // The group's ranks share one node: an uneven all-to-all sends its blocks as messages between
  // pairs (uneven_alltoall.h).
  bool one_node_;
  std::atomic<int32_t> priority_{0};
  std::unique_ptr<CollectiveWorker> worker_;
};

}  // namespace gradsync::torch_backend
