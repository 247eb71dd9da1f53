// The reduction loops, compiled once per instruction set (see reduce_generic.cpp,
// reduce_avx2.cpp). Included inside namespace GRADSYNC_KERNEL_NAMESPACE.
#include <gradsync/gradsync.h>

#include "kernels/convert.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace gradsync::kernels::GRADSYNC_KERNEL_NAMESPACE {

// Elements per block: the accumulator (<= 8 KiB) stays in L1 while K inputs stream through.
inline constexpr size_t kBlockElements = 1024;

// Copies with non-temporal stores: the destination is not read first (no read-for-ownership)
// and does not evict the inputs from the cache. Unaligned head and tail go through memcpy.
inline void stream_copy(void* dst, const void* src, size_t bytes) {
#ifdef __AVX2__
  using Vector = __m256i;
#else
  using Vector = __m128i;
#endif
  constexpr size_t kVector = sizeof(Vector);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const size_t head =
      std::min(bytes, (kVector - reinterpret_cast<uintptr_t>(d) % kVector) % kVector);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + kVector <= bytes; i += kVector) {
#ifdef __AVX2__
    _mm256_stream_si256(reinterpret_cast<Vector*>(d + i),
                        _mm256_loadu_si256(reinterpret_cast<const Vector*>(s + i)));
#else
    _mm_stream_si128(reinterpret_cast<Vector*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const Vector*>(s + i)));
#endif
  }
  std::memcpy(d + i, s + i, bytes - i);
}

inline void store_block(void* dst, const void* src, size_t bytes, bool streaming) {
  if (streaming) {
    stream_copy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

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
                  size_t num_outputs, size_t begin, size_t n, bool streaming) {
  using T = Traits<Storage>;
  using Acc = typename T::Acc;
  auto combine = [](Acc a, Acc b) {
    if constexpr (Op == GRADSYNC_SUM || Op == GRADSYNC_AVG) {
      return wrapping_add(a, b);
    } else if constexpr (Op == GRADSYNC_PROD) {
      return wrapping_mul(a, b);
    } else if constexpr (Op == GRADSYNC_MIN) {
      return b < a ? b : a;
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
  };
  alignas(64) Acc acc[kBlockElements];
  // The first pass reads two inputs at once: two streams in flight keep the prefetchers busier
  // than one (measured: about 1.4x on a 64 MiB two-rank sum).
  const Storage* __restrict first = static_cast<const Storage*>(inputs[0]) + begin;
  if (num_inputs >= 2) {
    const Storage* __restrict second = static_cast<const Storage*>(inputs[1]) + begin;
    for (size_t i = 0; i < n; ++i) acc[i] = combine(T::load(first[i]), T::load(second[i]));
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] = T::load(first[i]);
  }
  for (size_t r = 2; r < num_inputs; ++r) {
    const Storage* __restrict in = static_cast<const Storage*>(inputs[r]) + begin;
    for (size_t i = 0; i < n; ++i) acc[i] = combine(acc[i], T::load(in[i]));
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
  // The result block goes out once per output; converted first where the types differ.
  const void* result = acc;
  alignas(64) Storage converted[std::is_same_v<Acc, Storage> ? 1 : kBlockElements];
  if constexpr (!std::is_same_v<Acc, Storage>) {
    for (size_t i = 0; i < n; ++i) converted[i] = T::store(acc[i]);
    result = converted;
  }
  for (size_t o = 0; o < num_outputs; ++o) {
    store_block(static_cast<Storage*>(outputs[o]) + begin, result, n * sizeof(Storage), streaming);
  }
}

template <typename Storage, gradsync_op Op>
void reduce_typed(const void* const* inputs, size_t num_inputs, void* const* outputs,
                  size_t num_outputs, size_t count, bool streaming) {
  for (size_t begin = 0; begin < count; begin += kBlockElements) {
    reduce_block<Storage, Op>(inputs, num_inputs, outputs, num_outputs, begin,
                              std::min(kBlockElements, count - begin), streaming);
  }
  // Non-temporal stores are weakly ordered: fence before anyone is told the result is there.
  if (streaming) _mm_sfence();
}

template <typename Storage>
void reduce_op(gradsync_op op, const void* const* inputs, size_t num_inputs, void* const* outputs,
               size_t num_outputs, size_t count, bool streaming) {
  switch (op) {
    case GRADSYNC_SUM:
      return reduce_typed<Storage, GRADSYNC_SUM>(inputs, num_inputs, outputs, num_outputs, count,
                                                 streaming);
    case GRADSYNC_AVG:
      return reduce_typed<Storage, GRADSYNC_AVG>(inputs, num_inputs, outputs, num_outputs, count,
                                                 streaming);
    case GRADSYNC_MIN:
      return reduce_typed<Storage, GRADSYNC_MIN>(inputs, num_inputs, outputs, num_outputs, count,
                                                 streaming);
    case GRADSYNC_MAX:
      return reduce_typed<Storage, GRADSYNC_MAX>(inputs, num_inputs, outputs, num_outputs, count,
                                                 streaming);
    case GRADSYNC_PROD:
      return reduce_typed<Storage, GRADSYNC_PROD>(inputs, num_inputs, outputs, num_outputs, count,
                                                  streaming);
    case GRADSYNC_BAND:
    case GRADSYNC_BOR:
    case GRADSYNC_BXOR:
      // Submissions pair the bitwise ops with integer dtypes only (ipc::op_reduces).
      if constexpr (std::is_integral_v<Storage>) {
        if (op == GRADSYNC_BAND) {
          return reduce_typed<Storage, GRADSYNC_BAND>(inputs, num_inputs, outputs, num_outputs,
                                                      count, streaming);
        }
        if (op == GRADSYNC_BOR) {
          return reduce_typed<Storage, GRADSYNC_BOR>(inputs, num_inputs, outputs, num_outputs,
                                                     count, streaming);
        }
        return reduce_typed<Storage, GRADSYNC_BXOR>(inputs, num_inputs, outputs, num_outputs, count,
                                                    streaming);
      }
      return;
  }
}

void reduce_to_all(gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
                   size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count,
                   bool streaming) {
  switch (dtype) {
    case GRADSYNC_FLOAT32:
      return reduce_op<float>(op, inputs, num_inputs, outputs, num_outputs, count, streaming);
    case GRADSYNC_FLOAT64:
      return reduce_op<double>(op, inputs, num_inputs, outputs, num_outputs, count, streaming);
    case GRADSYNC_FLOAT16:
      return reduce_op<Half>(op, inputs, num_inputs, outputs, num_outputs, count, streaming);
    case GRADSYNC_BFLOAT16:
      return reduce_op<BFloat16>(op, inputs, num_inputs, outputs, num_outputs, count, streaming);
    case GRADSYNC_INT32:
      return reduce_op<int32_t>(op, inputs, num_inputs, outputs, num_outputs, count, streaming);
    case GRADSYNC_INT64:
      return reduce_op<int64_t>(op, inputs, num_inputs, outputs, num_outputs, count, streaming);
  }
}

void copy(void* dst, const void* src, size_t bytes, bool streaming) {
  if (!streaming) {
    std::memcpy(dst, src, bytes);
    return;
  }
  stream_copy(dst, src, bytes);
  _mm_sfence();
}

}  // namespace gradsync::kernels::GRADSYNC_KERNEL_NAMESPACE
