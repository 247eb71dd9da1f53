#include "tools/common/reference.h"

#include "kernels/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

namespace gradsync::reference {

double input_value(int rank, size_t i, gradsync_op op, uint64_t seed) {
  const uint64_t mix = static_cast<uint64_t>(rank) * 7 + i * 13 + seed * 5;
  if (op == GRADSYNC_PROD) {
    // Values of magnitude 1 or 2 keep products of many ranks exact and in range.
    const uint64_t pick = mix % 5;
    return pick == 0 ? -1.0 : (pick == 1 ? 2.0 : 1.0);
  }
  if (op == GRADSYNC_BAND || op == GRADSYNC_BOR || op == GRADSYNC_BXOR) {
    // Every pattern of the low 8 bits, negative ones too: each bit set on some ranks only.
    return static_cast<double>(static_cast<int64_t>((mix * 37) % 256) - 128);
  }
  return static_cast<double>(static_cast<int64_t>(mix % 11) - 5);
}

double expected_allreduce(int ranks, size_t i, gradsync_dtype dtype, gradsync_op op,
                          uint64_t seed) {
  double acc = input_value(0, i, op, seed);
  for (int r = 1; r < ranks; ++r) {
    const double v = input_value(r, i, op, seed);
    switch (op) {
      case GRADSYNC_SUM:
      case GRADSYNC_AVG:
        acc += v;
        break;
      case GRADSYNC_PROD:
        acc *= v;
        break;
      case GRADSYNC_MIN:
        acc = std::min(acc, v);
        break;
      case GRADSYNC_MAX:
        acc = std::max(acc, v);
        break;
      case GRADSYNC_BAND:
        acc = static_cast<double>(static_cast<int64_t>(acc) & static_cast<int64_t>(v));
        break;
      case GRADSYNC_BOR:
        acc = static_cast<double>(static_cast<int64_t>(acc) | static_cast<int64_t>(v));
        break;
      case GRADSYNC_BXOR:
        acc = static_cast<double>(static_cast<int64_t>(acc) ^ static_cast<int64_t>(v));
        break;
    }
  }
  if (op == GRADSYNC_AVG) {
    const bool integral = dtype == GRADSYNC_INT32 || dtype == GRADSYNC_INT64;
    acc = integral ? std::trunc(acc / ranks) : acc / ranks;
  }
  return acc;
}

void store(void* base, size_t i, gradsync_dtype dtype, double value) {
  switch (dtype) {
    case GRADSYNC_FLOAT32:
      static_cast<float*>(base)[i] = static_cast<float>(value);
      break;
    case GRADSYNC_FLOAT64:
      static_cast<double*>(base)[i] = value;
      break;
    case GRADSYNC_FLOAT16:
      static_cast<uint16_t*>(base)[i] = kernels::float_to_half(static_cast<float>(value));
      break;
    case GRADSYNC_BFLOAT16:
      static_cast<uint16_t*>(base)[i] = kernels::float_to_bfloat16(static_cast<float>(value));
      break;
    case GRADSYNC_INT32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(value);
      break;
    case GRADSYNC_INT64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(value);
      break;
  }
}

double load(const void* base, size_t i, gradsync_dtype dtype) {
  switch (dtype) {
    case GRADSYNC_FLOAT32:
      return static_cast<const float*>(base)[i];
    case GRADSYNC_FLOAT64:
      return static_cast<const double*>(base)[i];
    case GRADSYNC_FLOAT16:
      return kernels::half_to_float(static_cast<const uint16_t*>(base)[i]);
    case GRADSYNC_BFLOAT16:
      return kernels::bfloat16_to_float(static_cast<const uint16_t*>(base)[i]);
    case GRADSYNC_INT32:
      return static_cast<const int32_t*>(base)[i];
    case GRADSYNC_INT64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
  }
  return NAN;
}

void fill_input(void* base, size_t count, gradsync_dtype dtype, int rank, gradsync_op op,
                uint64_t seed) {
  for (size_t i = 0; i < count; ++i) store(base, i, dtype, input_value(rank, i, op, seed));
}

void fill_mixed_magnitudes(float* data, size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-20, 20);
  for (size_t i = 0; i < count; ++i) data[i] = std::ldexp(mantissa(random), exponent(random));
}

bool matches(double got, double expected, gradsync_dtype dtype) {
  double tolerance = 0;
  switch (dtype) {
    case GRADSYNC_FLOAT32:
      tolerance = 1e-6;
      break;
    case GRADSYNC_FLOAT64:
      tolerance = 1e-12;
      break;
    case GRADSYNC_FLOAT16:
      tolerance = 1e-3;
      break;  // 10-bit mantissa
    case GRADSYNC_BFLOAT16:
      tolerance = 8e-3;
      break;  // 7-bit mantissa
    case GRADSYNC_INT32:
    case GRADSYNC_INT64:
      return got == expected;
  }
  return std::fabs(got - expected) <= tolerance * std::max(1.0, std::fabs(expected));
}

size_t count_wrong(Kind kind, const void* result, size_t count, gradsync_dtype dtype,
                   gradsync_op op, int ranks, int root, uint64_t seed) {
  size_t wrong = 0;
  switch (kind) {
    case Kind::kAllreduce:
      for (size_t i = 0; i < count; ++i) {
        wrong +=
            !matches(load(result, i, dtype), expected_allreduce(ranks, i, dtype, op, seed), dtype);
      }
      break;
    case Kind::kBroadcast:
      for (size_t i = 0; i < count; ++i) {
        wrong += !matches(load(result, i, dtype), input_value(root, i, op, seed), dtype);
      }
      break;
    case Kind::kAllgather:
      for (int r = 0; r < ranks; ++r) {
        for (size_t i = 0; i < count; ++i) {
          wrong += !matches(load(result, static_cast<size_t>(r) * count + i, dtype),
                            input_value(r, i, op, seed), dtype);
        }
      }
      break;
  }
  return wrong;
}

size_t count_wrong_reduce_scatter(const void* result, size_t count, gradsync_dtype dtype,
                                  gradsync_op op, int ranks, int rank, uint64_t seed) {
  size_t wrong = 0;
  const size_t first = static_cast<size_t>(rank) * count;
  for (size_t i = 0; i < count; ++i) {
    wrong += !matches(load(result, i, dtype), expected_allreduce(ranks, first + i, dtype, op, seed),
                      dtype);
  }
  return wrong;
}

size_t count_wrong_alltoall(const void* result, size_t count, gradsync_dtype dtype, gradsync_op op,
                            int ranks, int rank, uint64_t seed) {
  size_t wrong = 0;
  const size_t first = static_cast<size_t>(rank) * count;
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < count; ++i) {
      wrong += !matches(load(result, static_cast<size_t>(r) * count + i, dtype),
                        input_value(r, first + i, op, seed), dtype);
    }
  }
  return wrong;
}

}  // namespace gradsync::reference
