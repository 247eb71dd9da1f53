// Device reductions, mirroring kernels/cpu/reduce_impl.h element for element: the same
// accumulator types, the same order of combination, the same avg and wrap-around rules.
#include "kernels/cuda/reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace gradsync::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kPackBytes = 16;  // one 128-bit load or store per operand
constexpr unsigned kBlocksPerMultiprocessor = 4;

struct LaunchShape {
  unsigned blocks = 0;
  unsigned threads = 0;
};

// Passed by value: kernel parameters live in constant memory, no copy to the device first.
struct Operands {
  const void* inputs[kMaxOperands];
  void* outputs[kMaxOperands];
  unsigned num_inputs;
  unsigned num_outputs;
};

// 16-bit floats travel as their bits (trivially copyable, packable); conversions are the
// round-to-nearest-even ones of the host kernels.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <typename Storage>
struct Traits {
  using Acc = Storage;
  __device__ static Acc load(Storage v) { return v; }
  __device__ static Storage store(Acc v) { return v; }
};
template <>
struct Traits<int32_t> {
  using Acc = int64_t;
  __device__ static Acc load(int32_t v) { return v; }
  __device__ static int32_t store(Acc v) {
    return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v)));
  }
};
template <>
struct Traits<Half> {
  using Acc = float;
  __device__ static Acc load(Half v) { return __half2float(__ushort_as_half(v.bits)); }
  __device__ static Half store(Acc v) { return Half{__half_as_ushort(__float2half_rn(v))}; }
};
template <>
struct Traits<BFloat16> {
  using Acc = float;
  __device__ static Acc load(BFloat16 v) { return __bfloat162float(__ushort_as_bfloat16(v.bits)); }
  __device__ static BFloat16 store(Acc v) {
    return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(v))};
  }
};

template <typename Acc, gradsync_op Op>
__device__ __forceinline__ Acc combine(Acc a, Acc b) {
  if constexpr (Op == GRADSYNC_SUM || Op == GRADSYNC_AVG) {
    if constexpr (std::is_integral_v<Acc>) {  // wraps, as two's complement
      using U = std::make_unsigned_t<Acc>;
      return static_cast<Acc>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  } else if constexpr (Op == GRADSYNC_PROD) {
    if constexpr (std::is_integral_v<Acc>) {
      using U = std::make_unsigned_t<Acc>;
      return static_cast<Acc>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  } else if constexpr (Op == GRADSYNC_MIN) {
    return b < a ? b : a;  // the host's comparison, so NaNs land where they land there
  } else if constexpr (Op == GRADSYNC_MAX) {
    return a < b ? b : a;
  } else if constexpr (Op == GRADSYNC_BAND) {
    return static_cast<Acc>(a & b);
  } else if constexpr (Op == GRADSYNC_BOR) {
    return static_cast<Acc>(a | b);
  } else {
    static_assert(Op == GRADSYNC_BXOR);
    return static_cast<Acc>(a ^ b);
  }
}

template <typename Acc, gradsync_op Op>
__device__ __forceinline__ Acc finish(Acc acc, unsigned num_inputs) {
  if constexpr (Op != GRADSYNC_AVG) {
    return acc;
  } else if constexpr (std::is_integral_v<Acc>) {
    return acc / static_cast<Acc>(num_inputs);
  } else {
    return acc * (Acc{1} / static_cast<Acc>(num_inputs));
  }
}

// One element: inputs combined in rank order, then written to every output. The pointers are
// not __restrict__ and never read through the read-only cache: outputs may alias inputs.
template <typename Storage, gradsync_op Op>
__device__ __forceinline__ void reduce_element(const Operands& operands, size_t i) {
  using T = Traits<Storage>;
  using Acc = typename T::Acc;
  Acc acc = T::load(static_cast<const Storage*>(operands.inputs[0])[i]);
  for (unsigned r = 1; r < operands.num_inputs; ++r) {
    acc = combine<Acc, Op>(acc, T::load(static_cast<const Storage*>(operands.inputs[r])[i]));
  }
  const Storage result = T::store(finish<Acc, Op>(acc, operands.num_inputs));
  for (unsigned o = 0; o < operands.num_outputs; ++o) {
    static_cast<Storage*>(operands.outputs[o])[i] = result;
  }
}

// One 16-byte pack of elements per operand: a single vector load per input, a single vector
// store per output.
template <typename Storage, gradsync_op Op>
__device__ __forceinline__ void reduce_pack(const Operands& operands, size_t pack) {
  using T = Traits<Storage>;
  using Acc = typename T::Acc;
  constexpr unsigned kElements = kPackBytes / sizeof(Storage);
  static_assert(kElements * sizeof(Storage) == kPackBytes);
  struct alignas(kPackBytes) Pack {
    Storage elements[kElements];
  };
  Acc acc[kElements];
  {
    const Pack in = static_cast<const Pack*>(operands.inputs[0])[pack];
#pragma unroll
    for (unsigned e = 0; e < kElements; ++e) acc[e] = T::load(in.elements[e]);
  }
  for (unsigned r = 1; r < operands.num_inputs; ++r) {
    const Pack in = static_cast<const Pack*>(operands.inputs[r])[pack];
#pragma unroll
    for (unsigned e = 0; e < kElements; ++e) {
      acc[e] = combine<Acc, Op>(acc[e], T::load(in.elements[e]));
    }
  }
  Pack out;
#pragma unroll
  for (unsigned e = 0; e < kElements; ++e) {
    out.elements[e] = T::store(finish<Acc, Op>(acc[e], operands.num_inputs));
  }
  for (unsigned o = 0; o < operands.num_outputs; ++o) {
    static_cast<Pack*>(operands.outputs[o])[pack] = out;
  }
}

// A grid-stride loop over packs (when every pointer is 16-byte aligned), then over the
// elements past the last whole pack.
template <typename Storage, gradsync_op Op, bool kPacked>
__global__ void __launch_bounds__(kThreads) reduce_kernel(Operands operands, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t scalar_begin = 0;
  if constexpr (kPacked) {
    constexpr size_t kElements = kPackBytes / sizeof(Storage);
    const size_t packs = count / kElements;
    for (size_t p = first; p < packs; p += stride) reduce_pack<Storage, Op>(operands, p);
    scalar_begin = packs * kElements;
  }
  for (size_t i = scalar_begin + first; i < count; i += stride) {
    reduce_element<Storage, Op>(operands, i);
  }
}

bool all_aligned(const Operands& operands) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % kPackBytes == 0; };
  return std::all_of(operands.inputs, operands.inputs + operands.num_inputs, aligned) &&
         std::all_of(operands.outputs, operands.outputs + operands.num_outputs, aligned);
}

// Enough blocks of kThreads to fill the device, no more than the work needs. Work items are
// packs where the pointers allow (the common case), elements otherwise: sizing for packs
// leaves an unaligned launch with fewer threads, each doing more, which is fine.
cudaError_t launch_shape(size_t element_bytes, size_t count, LaunchShape& shape) {
  int device = 0;
  int multiprocessors = 0;
  if (const cudaError_t status = cudaGetDevice(&device); status != cudaSuccess) return status;
  if (const cudaError_t status =
          cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
      status != cudaSuccess) {
    return status;
  }
  const size_t items = std::max<size_t>(count * element_bytes / kPackBytes, 1);
  const size_t wanted = (items + kThreads - 1) / kThreads;
  const size_t most = static_cast<size_t>(std::max(multiprocessors, 1)) * kBlocksPerMultiprocessor;
  shape = LaunchShape{static_cast<unsigned>(std::min(wanted, most)), kThreads};
  return cudaSuccess;
}

template <typename Storage, gradsync_op Op>
cudaError_t launch(const Operands& operands, size_t count, cudaStream_t stream) {
  if (count == 0 || operands.num_outputs == 0) return cudaSuccess;  // nothing to launch
  LaunchShape shape;
  if (const cudaError_t status = launch_shape(sizeof(Storage), count, shape);
      status != cudaSuccess) {
    return status;
  }
  if (all_aligned(operands)) {
    reduce_kernel<Storage, Op, true><<<shape.blocks, shape.threads, 0, stream>>>(operands, count);
  } else {
    reduce_kernel<Storage, Op, false><<<shape.blocks, shape.threads, 0, stream>>>(operands, count);
  }
  return cudaGetLastError();
}

template <typename Storage>
cudaError_t launch_op(gradsync_op op, const Operands& operands, size_t count, cudaStream_t stream) {
  switch (op) {
    case GRADSYNC_SUM:
      return launch<Storage, GRADSYNC_SUM>(operands, count, stream);
    case GRADSYNC_AVG:
      return launch<Storage, GRADSYNC_AVG>(operands, count, stream);
    case GRADSYNC_MIN:
      return launch<Storage, GRADSYNC_MIN>(operands, count, stream);
    case GRADSYNC_MAX:
      return launch<Storage, GRADSYNC_MAX>(operands, count, stream);
    case GRADSYNC_PROD:
      return launch<Storage, GRADSYNC_PROD>(operands, count, stream);
    case GRADSYNC_BAND:
    case GRADSYNC_BOR:
    case GRADSYNC_BXOR:
      if constexpr (std::is_integral_v<Storage>) {  // integer dtypes only (ipc::op_reduces)
        if (op == GRADSYNC_BAND) return launch<Storage, GRADSYNC_BAND>(operands, count, stream);
        if (op == GRADSYNC_BOR) return launch<Storage, GRADSYNC_BOR>(operands, count, stream);
        return launch<Storage, GRADSYNC_BXOR>(operands, count, stream);
      }
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t reduce_to_all(gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
                          size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count,
                          cudaStream_t stream) {
  if (num_inputs == 0 || num_inputs > kMaxOperands || num_outputs > kMaxOperands) {
    return cudaErrorInvalidValue;
  }
  Operands operands{};
  std::copy_n(inputs, num_inputs, operands.inputs);
  std::copy_n(outputs, num_outputs, operands.outputs);
  operands.num_inputs = static_cast<unsigned>(num_inputs);
  operands.num_outputs = static_cast<unsigned>(num_outputs);
  switch (dtype) {  // an unknown dtype or op falls through to cudaErrorInvalidValue
    case GRADSYNC_FLOAT32:
      return launch_op<float>(op, operands, count, stream);
    case GRADSYNC_FLOAT64:
      return launch_op<double>(op, operands, count, stream);
    case GRADSYNC_FLOAT16:
      return launch_op<Half>(op, operands, count, stream);
    case GRADSYNC_BFLOAT16:
      return launch_op<BFloat16>(op, operands, count, stream);
    case GRADSYNC_INT32:
      return launch_op<int32_t>(op, operands, count, stream);
    case GRADSYNC_INT64:
      return launch_op<int64_t>(op, operands, count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gradsync::kernels::cuda
