#include "client/torch/work.h"

#include <utility>

namespace gradsync::torch_backend {

GradsyncWork::GradsyncWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                           c10::Device device)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()),
          device.is_cpu() ? std::vector<c10::Device>{} : std::vector<c10::Device>{device})) {}

void GradsyncWork::complete() {
  finish();
  future_->markCompleted(c10::IValue(outputs_));
}

void GradsyncWork::fail(const std::exception_ptr& error) {
  finish(error);
  future_->setError(error);
}

}  // namespace gradsync::torch_backend
