// The device kernels against the host kernels, bit for bit: every op x dtype, 1 to 8 inputs on
// one GPU, counts around the 16-byte pack, pointers that break the pack's alignment, in place
// and out of place.
#include "ipc/protocol.h"
#include "kernels/convert.h"
#include "kernels/cuda/reduce.h"
#include "kernels/reduce.h"
#include "tests/gpu/gpu_testing.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

namespace gradsync::gpu_testing {
namespace {

const gradsync_dtype kDtypes[] = {GRADSYNC_FLOAT32,  GRADSYNC_FLOAT64, GRADSYNC_FLOAT16,
                                  GRADSYNC_BFLOAT16, GRADSYNC_INT32,   GRADSYNC_INT64};
const gradsync_op kOps[] = {GRADSYNC_SUM,  GRADSYNC_AVG,  GRADSYNC_MIN, GRADSYNC_MAX,
                            GRADSYNC_PROD, GRADSYNC_BAND, GRADSYNC_BOR, GRADSYNC_BXOR};

// Random values: floats in [0.5, 2) with random signs (products neither vanish nor overflow
// over 8 inputs), integers over their whole range (sums and products wrap).
std::vector<uint8_t> random_input(gradsync_dtype dtype, size_t count, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<float> magnitude(0.5f, 2.0f);
  const size_t element = ipc::dtype_bytes(dtype);
  std::vector<uint8_t> bytes(count * element);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* out = bytes.data() + i * element;
    const float value = (random() & 1 ? -1.0f : 1.0f) * magnitude(random);
    const uint64_t bits = random();
    switch (dtype) {
      case GRADSYNC_FLOAT32:
        std::memcpy(out, &value, 4);
        break;
      case GRADSYNC_FLOAT64: {
        const double wide = value;
        std::memcpy(out, &wide, 8);
        break;
      }
      case GRADSYNC_FLOAT16:
      case GRADSYNC_BFLOAT16: {
        const uint16_t narrow = dtype == GRADSYNC_FLOAT16 ? kernels::float_to_half(value)
                                                          : kernels::float_to_bfloat16(value);
        std::memcpy(out, &narrow, 2);
        break;
      }
      case GRADSYNC_INT32:
      case GRADSYNC_INT64:
        std::memcpy(out, &bits, element);
        break;
    }
  }
  return bytes;
}

using Params = std::tuple<gradsync_dtype, gradsync_op, int /*inputs*/>;
class DeviceReduceTest : public ::testing::TestWithParam<Params> {};

// The inputs of one count and the host kernels' outputs for them: made once, checked against
// the device in every placement (the random inputs and the host reduction dominate the time).
struct Reference {
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<std::vector<uint8_t>> outputs;
};

Reference host_reference(gradsync_dtype dtype, gradsync_op op, int inputs, size_t count) {
  const size_t bytes = count * ipc::dtype_bytes(dtype);
  Reference reference;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (int r = 0; r < inputs; ++r) {
    reference.inputs.push_back(random_input(dtype, count, 1000ull * r + count));
    reference.outputs.emplace_back(bytes);
  }
  for (int r = 0; r < inputs; ++r) {
    in_ptrs.push_back(reference.inputs[r].data());
    out_ptrs.push_back(reference.outputs[r].data());
  }
  kernels::reduce_to_all(dtype, op, in_ptrs.data(), in_ptrs.size(), out_ptrs.data(),
                         out_ptrs.size(), count, false);
  return reference;
}

void check(gradsync_dtype dtype, gradsync_op op, const Reference& reference, size_t count,
           size_t element_offset, bool in_place) {
  const size_t element = ipc::dtype_bytes(dtype);
  const size_t offset = element_offset * element;
  const size_t bytes = count * element;
  const size_t inputs = reference.inputs.size();
  std::vector<std::unique_ptr<DeviceMemory>> device_in;
  std::vector<std::unique_ptr<DeviceMemory>> device_out;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (size_t r = 0; r < inputs; ++r) {
    device_in.push_back(std::make_unique<DeviceMemory>(bytes + offset));
    device_in.back()->upload(reference.inputs[r], offset);
    in_ptrs.push_back(device_in.back()->data() + offset);
    if (in_place) {
      out_ptrs.push_back(device_in.back()->data() + offset);
    } else {
      device_out.push_back(std::make_unique<DeviceMemory>(bytes + offset));
      out_ptrs.push_back(device_out.back()->data() + offset);
    }
  }
  ASSERT_EQ(kernels::cuda::reduce_to_all(dtype, op, in_ptrs.data(), in_ptrs.size(), out_ptrs.data(),
                                         out_ptrs.size(), count, nullptr),
            cudaSuccess);
  GRADSYNC_CUDA_CHECK(cudaDeviceSynchronize());
  for (size_t r = 0; r < inputs; ++r) {
    const DeviceMemory& memory = in_place ? *device_in[r] : *device_out[r];
    const std::vector<uint8_t> got = memory.download(offset, bytes);
    const std::vector<uint8_t>& want = reference.outputs[r];
    size_t first_wrong = count;
    for (size_t i = 0; i < count && first_wrong == count; ++i) {
      if (std::memcmp(got.data() + i * element, want.data() + i * element, element) != 0) {
        first_wrong = i;
      }
    }
    ASSERT_EQ(first_wrong, count) << "output " << r << " of " << inputs << ", count " << count
                                  << ", element offset " << element_offset
                                  << (in_place ? ", in place" : "") << ": first wrong element";
  }
}

TEST_P(DeviceReduceTest, MatchesTheHostKernelsBitForBit) {
  const auto [dtype, op, inputs] = GetParam();
  for (const size_t count : {size_t{1}, size_t{7}, size_t{4099}, size_t{(1 << 18) + 3}}) {
    const Reference reference = host_reference(dtype, op, inputs, count);
    for (const size_t element_offset : {size_t{0}, size_t{1}}) {
      for (const bool in_place : {false, true}) {
        check(dtype, op, reference, count, element_offset, in_place);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Every op with every dtype it reduces (the bitwise ops: the integers).
std::vector<std::tuple<gradsync_dtype, gradsync_op, int>> every_op_and_dtype() {
  std::vector<std::tuple<gradsync_dtype, gradsync_op, int>> params;
  for (const gradsync_dtype dtype : kDtypes) {
    for (const gradsync_op op : kOps) {
      if (!ipc::op_reduces(op, dtype)) continue;
      for (int inputs = 1; inputs <= 8; ++inputs) params.emplace_back(dtype, op, inputs);
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(EveryOpAndDtype, DeviceReduceTest,
                         ::testing::ValuesIn(every_op_and_dtype()));

TEST(DeviceReduce, RefusesWhatItCannotLaunch) {
  DeviceMemory memory(1024);
  std::vector<const void*> inputs(kernels::cuda::kMaxOperands + 1, memory.data());
  void* output = memory.data();
  EXPECT_EQ(kernels::cuda::reduce_to_all(GRADSYNC_FLOAT32, GRADSYNC_SUM, inputs.data(),
                                         inputs.size(), &output, 1, 16, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::cuda::reduce_to_all(static_cast<gradsync_dtype>(99), GRADSYNC_SUM,
                                         inputs.data(), 2, &output, 1, 16, nullptr),
            cudaErrorInvalidValue);
  // Nothing to do is done at once, without a launch.
  EXPECT_EQ(kernels::cuda::reduce_to_all(GRADSYNC_FLOAT32, GRADSYNC_SUM, inputs.data(), 2, &output,
                                         1, 0, nullptr),
            cudaSuccess);
}

}  // namespace
}  // namespace gradsync::gpu_testing
