// Every op x dtype of the host kernels against a double-precision reference, with odd counts,
// block boundaries, element offsets that break vector alignment, in place and out of place.
#include "kernels/reduce.h"
#include "ipc/protocol.h"
#include "kernels/convert.h"
#include "kernels/cpu/reduce_variants.h"
#include "tools/common/reference.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace gradsync::kernels {
namespace {

using reference::expected_allreduce;
using reference::fill_input;
using reference::load;
using reference::matches;

const gradsync_dtype kDtypes[] = {GRADSYNC_FLOAT32,  GRADSYNC_FLOAT64, GRADSYNC_FLOAT16,
                                  GRADSYNC_BFLOAT16, GRADSYNC_INT32,   GRADSYNC_INT64};
const gradsync_op kOps[] = {GRADSYNC_SUM,  GRADSYNC_AVG,  GRADSYNC_MIN, GRADSYNC_MAX,
                            GRADSYNC_PROD, GRADSYNC_BAND, GRADSYNC_BOR, GRADSYNC_BXOR};

using Params = std::tuple<gradsync_dtype, gradsync_op, int /*ranks*/, bool /*avx2*/>;

class ReduceTest : public ::testing::TestWithParam<Params> {};

void check_reduce(ReduceFn reduce, gradsync_dtype dtype, gradsync_op op, int ranks, size_t count,
                  size_t element_offset, bool in_place, bool streaming) {
  const size_t element = ipc::dtype_bytes(dtype);
  const size_t bytes = (count + element_offset + 16) * element;
  std::vector<std::vector<uint8_t>> inputs(ranks, std::vector<uint8_t>(bytes));
  std::vector<std::vector<uint8_t>> outputs(ranks, std::vector<uint8_t>(bytes, 0xAB));
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (int r = 0; r < ranks; ++r) {
    uint8_t* in = inputs[r].data() + element_offset * element;
    fill_input(in, count, dtype, r, op);
    in_ptrs.push_back(in);
    out_ptrs.push_back(in_place ? in : outputs[r].data() + element_offset * element);
  }
  reduce(dtype, op, in_ptrs.data(), in_ptrs.size(), out_ptrs.data(), out_ptrs.size(), count,
         streaming);
  for (int r = 0; r < ranks; ++r) {
    size_t wrong = 0;
    size_t first_wrong = count;
    for (size_t i = 0; i < count; ++i) {
      if (!matches(load(out_ptrs[r], i, dtype), expected_allreduce(ranks, i, dtype, op), dtype)) {
        if (wrong++ == 0) first_wrong = i;
      }
    }
    ASSERT_EQ(wrong, 0u) << "rank " << r << " count " << count << " offset " << element_offset
                         << (in_place ? " in place" : "") << (streaming ? " streaming" : "")
                         << ": first wrong element " << first_wrong << " = "
                         << load(out_ptrs[r], first_wrong, dtype) << ", expected "
                         << expected_allreduce(ranks, first_wrong, dtype, op);
    if (!in_place) {
      // Nothing written past the end of the output.
      const uint8_t* end = static_cast<uint8_t*>(out_ptrs[r]) + count * element;
      for (size_t b = 0; b < 16 * element; ++b) ASSERT_EQ(end[b], 0xAB) << "overrun at " << b;
    }
  }
}

TEST_P(ReduceTest, MatchesReference) {
  const auto [dtype, op, ranks, use_avx2] = GetParam();
  if (use_avx2 && !cpu_has_avx2()) GTEST_SKIP() << "this CPU has no AVX2";
  const ReduceFn reduce = use_avx2 ? &avx2::reduce_to_all : &generic::reduce_to_all;
  for (size_t count : {1u, 7u, 31u, 2047u, 2048u, 2049u, 10001u}) {
    for (size_t offset : {0u, 1u, 3u}) {
      for (bool streaming : {false, true}) {
        check_reduce(reduce, dtype, op, ranks, count, offset, false, streaming);
        check_reduce(reduce, dtype, op, ranks, count, offset, true, streaming);
      }
    }
  }
}

// The dispatcher copies a single input instead of running a kernel: the same results.
TEST(Reduce, OneInputThroughTheDispatcherMatchesReference) {
  for (const gradsync_dtype dtype : kDtypes) {
    for (const gradsync_op op : kOps) {
      if (!ipc::op_reduces(op, dtype)) continue;
      for (size_t count : {1u, 7u, 2049u}) {
        for (bool streaming : {false, true}) {
          check_reduce(&reduce_to_all, dtype, op, 1, count, 1, false, streaming);
          check_reduce(&reduce_to_all, dtype, op, 1, count, 1, true, streaming);
        }
      }
    }
  }
}

TEST(Reduce, ZeroCountWritesNothing) {
  float in = 1.0f;
  float out = 5.0f;
  const void* inputs[] = {&in};
  void* outputs[] = {&out};
  reduce_to_all(GRADSYNC_FLOAT32, GRADSYNC_SUM, inputs, 1, outputs, 1, 0, true);
  EXPECT_EQ(out, 5.0f);
}

TEST(Reduce, IntegerSumWrapsInsteadOfOverflowing) {
  const int32_t a = INT32_MAX;
  const int32_t b = 1;
  int32_t out = 0;
  const void* inputs[] = {&a, &b};
  void* outputs[] = {&out};
  reduce_to_all(GRADSYNC_INT32, GRADSYNC_SUM, inputs, 2, outputs, 1, 1, false);
  EXPECT_EQ(out, INT32_MIN);
}

TEST(Reduce, HalfAccumulatesInFloat) {
  // 2048 + 1 + 1 is not representable step by step in fp16 (2049 rounds to 2048), but the sum
  // accumulated in f32 is 2050, which is.
  const uint16_t a = float_to_half(2048.0f);
  const uint16_t b = float_to_half(1.0f);
  const uint16_t c = float_to_half(1.0f);
  uint16_t out = 0;
  const void* inputs[] = {&a, &b, &c};
  void* outputs[] = {&out};
  reduce_to_all(GRADSYNC_FLOAT16, GRADSYNC_SUM, inputs, 3, outputs, 1, 1, false);
  EXPECT_EQ(half_to_float(out), 2050.0f);
}

TEST(Copy, StreamingCopyHandlesEveryAlignmentAndLength) {
  std::vector<uint8_t> src(4096), dst(4200);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  for (CopyFn copy_fn : {&generic::copy, &avx2::copy}) {
    if (copy_fn == &avx2::copy && !cpu_has_avx2()) continue;
    for (size_t offset : {0u, 1u, 15u, 31u, 33u}) {
      for (size_t bytes : {0u, 1u, 31u, 32u, 100u, 4000u}) {
        std::fill(dst.begin(), dst.end(), 0);
        copy_fn(dst.data() + offset, src.data() + 3, bytes, true);
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(dst[offset + i], src[3 + i]);
        for (size_t i = offset + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0) << "overrun";
        for (size_t i = 0; i < offset; ++i) ASSERT_EQ(dst[i], 0) << "underrun";
      }
    }
  }
}

TEST(Convert, PortableHalfMatchesTheCompilerForEveryHalf) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float expected = half_to_float(h);
    const float got = half_to_float_portable(h);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << bits;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected)) << bits;
    }
  }
}

TEST(Convert, PortableFloatToHalfRoundsLikeTheCompiler) {
  std::vector<float> values = {
      0.0f,     -0.0f,   1.0f,     65504.0f, 65519.0f,
      65520.0f, 1e9f,    -1e9f,    5.96e-8f, 2.98e-8f,
      2.99e-8f, 6.1e-5f, 6.09e-5f, 1e-10f,   std::numeric_limits<float>::infinity()};
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    const float v = std::bit_cast<float>(state);
    if (!std::isnan(v)) values.push_back(v);
  }
  for (uint32_t bits = 0; bits < 65536; ++bits) {  // every half and the midpoints next to it
    const float h = half_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(h)) continue;
    const uint32_t u = std::bit_cast<uint32_t>(h);
    values.push_back(h);
    values.push_back(std::bit_cast<float>(u + 0x1000u));
    values.push_back(std::bit_cast<float>(u + 0xfffu));
  }
  for (float v : values) {
    ASSERT_EQ(float_to_half_portable(v), float_to_half(v)) << v;
  }
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half_portable(std::nanf("")))));
}

TEST(Reduce, DispatchPicksAnInstructionSet) {
  const std::string isa = reduce_isa();
  EXPECT_TRUE(isa == "avx2" || isa == "generic") << isa;
}

std::string name(const ::testing::TestParamInfo<Params>& info) {
  static const char* dtypes[] = {"f32", "f64", "f16", "bf16", "i32", "i64"};
  static const char* ops[] = {"sum", "avg", "min", "max", "prod", "band", "bor", "bxor"};
  return std::string(dtypes[std::get<0>(info.param)]) + "_" + ops[std::get<1>(info.param)] + "_" +
         std::to_string(std::get<2>(info.param)) + "ranks_" +
         (std::get<3>(info.param) ? "avx2" : "generic");
}

// Every op with every dtype it reduces (the bitwise ops: the integers).
std::vector<Params> every_op_and_dtype() {
  std::vector<Params> params;
  for (const gradsync_dtype dtype : kDtypes) {
    for (const gradsync_op op : kOps) {
      if (!ipc::op_reduces(op, dtype)) continue;
      for (const int ranks : {1, 2, 3, 4, 8}) {
        for (const bool avx2 : {false, true}) params.emplace_back(dtype, op, ranks, avx2);
      }
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(AllOpsAndDtypes, ReduceTest, ::testing::ValuesIn(every_op_and_dtype()),
                         name);

}  // namespace
}  // namespace gradsync::kernels
