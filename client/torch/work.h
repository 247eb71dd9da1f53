// The Work a gradsync process group hands back: completed by the collective worker, waited on
// by the caller, and carrying the future DDP chains its bucket callbacks on.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>
#include <vector>

namespace gradsync::torch_backend {

class GradsyncWork : public c10d::Work {
 public:
  // `device`: where the outputs lie (the future of CUDA tensors must name their device).
  GradsyncWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, c10::Device device);

  // Called once, by the collective worker: wakes the waiters, then runs the future's callbacks.
  void complete();
  void fail(const std::exception_ptr& error);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace gradsync::torch_backend
