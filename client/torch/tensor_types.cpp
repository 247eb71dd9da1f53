#include "client/torch/tensor_types.h"

#include <c10/util/Exception.h>

#include <type_traits>

namespace gradsync::torch_backend {
namespace {

[[noreturn]] void unsupported_op(const char* call, const char* op) {
  TORCH_CHECK(false, "gradsync: ", call, " does not support the reduction op ", op,
              " (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR and PREMUL_SUM are supported)");
}

// PREMUL_SUM's factor: a number, or a tensor (one per input tensor in PyTorch 1, of which a
// process group's calls have one; a single one in PyTorch 2).
template <typename Supplement, typename = void>
struct HasFactorPerTensor : std::false_type {};
template <typename Supplement>
struct HasFactorPerTensor<Supplement, std::void_t<decltype(Supplement::tensor_factors)>>
    : std::true_type {};

template <typename Supplement>
at::Tensor premultiplier_of(const Supplement& supplement) {
  if constexpr (HasFactorPerTensor<Supplement>::value) {
    if (!supplement.tensor_factors.empty()) return supplement.tensor_factors.front();
  } else {
    if (supplement.tensor_factor.defined()) return supplement.tensor_factor;
  }
  return at::scalar_tensor(supplement.double_factor, at::kDouble);
}

}  // namespace

ReducedType reduced_type(const at::Tensor& tensor, const Reduction& reduction, const char* call) {
  const gradsync_op op = reduction.op;
  const bool bitwise = op == GRADSYNC_BAND || op == GRADSYNC_BOR || op == GRADSYNC_BXOR;
  TORCH_CHECK(!bitwise || !at::isFloatingType(tensor.scalar_type()), "gradsync: ", call, " of ",
              tensor.scalar_type(),
              " tensors: the bitwise ops BAND, BOR and BXOR reduce integer and bool tensors");
  TORCH_CHECK(!reduction.premultiplied() || at::isFloatingType(tensor.scalar_type()),
              "gradsync: ", call, " of ", tensor.scalar_type(),
              " tensors: PREMUL_SUM reduces floating-point tensors");
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

Reduction reduction_of(const c10d::ReduceOp& op, const char* call) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return {GRADSYNC_SUM};
    case c10d::ReduceOp::AVG:
      return {GRADSYNC_AVG};
    case c10d::ReduceOp::PRODUCT:
      return {GRADSYNC_PROD};
    case c10d::ReduceOp::MIN:
      return {GRADSYNC_MIN};
    case c10d::ReduceOp::MAX:
      return {GRADSYNC_MAX};
    case c10d::ReduceOp::BAND:
      return {GRADSYNC_BAND};
    case c10d::ReduceOp::BOR:
      return {GRADSYNC_BOR};
    case c10d::ReduceOp::BXOR:
      return {GRADSYNC_BXOR};
    case c10d::ReduceOp::PREMUL_SUM: {
      // PyTorch gives PREMUL_SUM no supplement of any other kind (its own backends cast so too:
      // a dynamic_cast would compare type information across separately built libraries).
      const auto* supplement =
          static_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(supplement != nullptr, "gradsync: ", call,
                  " got PREMUL_SUM without its factor (make it with "
                  "torch.distributed._make_nccl_premul_sum)");
      return {GRADSYNC_SUM, premultiplier_of(*supplement)};
    }
    default:
      unsupported_op(call, "of an unknown kind");
  }
}

}  // namespace gradsync::torch_backend
