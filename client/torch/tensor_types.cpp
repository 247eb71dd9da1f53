#include "client/torch/tensor_types.h"

#include <c10/util/Exception.h>

namespace gradsync::torch_backend {
namespace {

[[noreturn]] void unsupported_op(const char* call, const char* op) {
  TORCH_CHECK(false, "gradsync: ", call, " does not support the reduction op ", op,
              " (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR are supported)");
}

}  // namespace

ReducedType reduced_type(const at::Tensor& tensor, gradsync_op op, const char* call) {
  const bool bitwise = op == GRADSYNC_BAND || op == GRADSYNC_BOR || op == GRADSYNC_BXOR;
  TORCH_CHECK(!bitwise || !at::isFloatingType(tensor.scalar_type()), "gradsync: ", call, " of ",
              tensor.scalar_type(),
              " tensors: the bitwise ops BAND, BOR and BXOR reduce integer and bool tensors");
  switch (tensor.scalar_type()) {
    case at::kFloat:
      return {at::kFloat, GRADSYNC_FLOAT32};
    case at::kDouble:
      return {at::kDouble, GRADSYNC_FLOAT64};
    case at::kHalf:
      return {at::kHalf, GRADSYNC_FLOAT16};
    case at::kBFloat16:
      return {at::kBFloat16, GRADSYNC_BFLOAT16};
    case at::kInt:
    case at::kShort:
    case at::kChar:
    case at::kByte:
    case at::kBool:
      return {at::kInt, GRADSYNC_INT32};
    case at::kLong:
      return {at::kLong, GRADSYNC_INT64};
    default:
      TORCH_CHECK(false, "gradsync: ", call, " cannot reduce ", tensor.scalar_type(),
                  " tensors (floating point, integer and bool tensors it can)");
  }
}

gradsync_op reduction_op(const c10d::ReduceOp& op, const char* call) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return GRADSYNC_SUM;
    case c10d::ReduceOp::AVG:
      return GRADSYNC_AVG;
    case c10d::ReduceOp::PRODUCT:
      return GRADSYNC_PROD;
    case c10d::ReduceOp::MIN:
      return GRADSYNC_MIN;
    case c10d::ReduceOp::MAX:
      return GRADSYNC_MAX;
    case c10d::ReduceOp::BAND:
      return GRADSYNC_BAND;
    case c10d::ReduceOp::BOR:
      return GRADSYNC_BOR;
    case c10d::ReduceOp::BXOR:
      return GRADSYNC_BXOR;
    case c10d::ReduceOp::PREMUL_SUM:
      unsupported_op(call, "PREMUL_SUM");
    default:
      unsupported_op(call, "of an unknown kind");
  }
}

}  // namespace gradsync::torch_backend
