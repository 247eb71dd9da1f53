// The reduction loops, compiled once per instruction set (see reduce_generic.cpp,
// reduce_avx2.cpp). Included inside namespace GRADSYNC_KERNEL_NAMESPACE.
#include <gradsync/gradsync.h>

#include "kernels/convert.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace gradsync::kernels::GRADSYNC_KERNEL_NAMESPACE {

// Elements per block: the accumulator (<= 16 KiB) stays in L1 while K inputs stream through.
inline constexpr size_t kBlockElements = 2048;

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <typename Storage>
struct Traits {
  using Acc = Storage;
  static Acc load(Storage v) { return v; }
  static Storage store(Acc v) { return v; }
};
template <>
struct Traits<int32_t> {
  using Acc = int64_t;
  static Acc load(int32_t v) { return v; }
  static int32_t store(Acc v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }
};
template <>
struct Traits<Half> {
  using Acc = float;
  static Acc load(Half v) { return half_to_float(v.bits); }
  static Half store(Acc v) { return Half{float_to_half(v)}; }
};
template <>
struct Traits<BFloat16> {
  using Acc = float;
  static Acc load(BFloat16 v) { return bfloat16_to_float(v.bits); }
  static BFloat16 store(Acc v) { return BFloat16{float_to_bfloat16(v)}; }
};

// Integer sums and products wrap (two's complement) instead of overflowing (UB).
template <typename T>
inline T wrapping_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename T>
inline T wrapping_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <typename Storage, gradsync_op Op>
void reduce_block(const void* const* inputs, size_t num_inputs, void* const* outputs,
                  size_t num_outputs, size_t begin, size_t n) {
  using T = Traits<Storage>;
  using Acc = typename T::Acc;
  Acc acc[kBlockElements];
  {
    const Storage* __restrict in = static_cast<const Storage*>(inputs[0]) + begin;
    for (size_t i = 0; i < n; ++i) acc[i] = T::load(in[i]);
  }
  for (size_t r = 1; r < num_inputs; ++r) {
    const Storage* __restrict in = static_cast<const Storage*>(inputs[r]) + begin;
    for (size_t i = 0; i < n; ++i) {
      const Acc v = T::load(in[i]);
      if constexpr (Op == GRADSYNC_SUM || Op == GRADSYNC_AVG) {
        acc[i] = wrapping_add(acc[i], v);
      } else if constexpr (Op == GRADSYNC_PROD) {
        acc[i] = wrapping_mul(acc[i], v);
      } else if constexpr (Op == GRADSYNC_MIN) {
        acc[i] = v < acc[i] ? v : acc[i];
      } else {
        acc[i] = acc[i] < v ? v : acc[i];
      }
    }
  }
  if constexpr (Op == GRADSYNC_AVG) {
    if constexpr (std::is_integral_v<Acc>) {
      const Acc divisor = static_cast<Acc>(num_inputs);
      for (size_t i = 0; i < n; ++i) acc[i] /= divisor;
    } else {
      const Acc scale = Acc{1} / static_cast<Acc>(num_inputs);
      for (size_t i = 0; i < n; ++i) acc[i] *= scale;
    }
  }
  for (size_t o = 0; o < num_outputs; ++o) {
    Storage* __restrict out = static_cast<Storage*>(outputs[o]) + begin;
    if constexpr (std::is_same_v<Acc, Storage>) {
      std::memcpy(out, acc, n * sizeof(Storage));
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = T::store(acc[i]);
    }
  }
}

template <typename Storage, gradsync_op Op>
void reduce_typed(const void* const* inputs, size_t num_inputs, void* const* outputs,
                  size_t num_outputs, size_t count) {
  for (size_t begin = 0; begin < count; begin += kBlockElements) {
    reduce_block<Storage, Op>(inputs, num_inputs, outputs, num_outputs, begin,
                              std::min(kBlockElements, count - begin));
  }
}

template <typename Storage>
void reduce_op(gradsync_op op, const void* const* inputs, size_t num_inputs, void* const* outputs,
               size_t num_outputs, size_t count) {
  switch (op) {
    case GRADSYNC_SUM: return reduce_typed<Storage, GRADSYNC_SUM>(inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_AVG: return reduce_typed<Storage, GRADSYNC_AVG>(inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_MIN: return reduce_typed<Storage, GRADSYNC_MIN>(inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_MAX: return reduce_typed<Storage, GRADSYNC_MAX>(inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_PROD: return reduce_typed<Storage, GRADSYNC_PROD>(inputs, num_inputs, outputs, num_outputs, count);
  }
}

void reduce_to_all(gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
                   size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count) {
  switch (dtype) {
    case GRADSYNC_FLOAT32: return reduce_op<float>(op, inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_FLOAT64: return reduce_op<double>(op, inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_FLOAT16: return reduce_op<Half>(op, inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_BFLOAT16: return reduce_op<BFloat16>(op, inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_INT32: return reduce_op<int32_t>(op, inputs, num_inputs, outputs, num_outputs, count);
    case GRADSYNC_INT64: return reduce_op<int64_t>(op, inputs, num_inputs, outputs, num_outputs, count);
  }
}

}  // namespace gradsync::kernels::GRADSYNC_KERNEL_NAMESPACE
