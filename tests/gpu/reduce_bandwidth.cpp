// A small benchmark, run as a gpu test: the reduce kernel's bandwidth (K inputs read, one
// output written) against cudaMemcpy's device-to-device copy on the same device, the ratio
// printed for BENCHMARKS.md. Results are checked; timings are reported, never asserted.
#include "kernels/cuda/reduce.h"
#include "tests/gpu/gpu_testing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace gradsync::gpu_testing {
namespace {

constexpr size_t kBytes = 256 << 20;
constexpr int kRepeats = 20;

// Median milliseconds of `repeats` runs of `body` on the default stream.
template <typename Body>
float median_ms(Body body) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  GRADSYNC_CUDA_CHECK(cudaEventCreate(&start));
  GRADSYNC_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  body();  // warm-up
  for (int i = 0; i < kRepeats; ++i) {
    GRADSYNC_CUDA_CHECK(cudaEventRecord(start, nullptr));
    body();
    GRADSYNC_CUDA_CHECK(cudaEventRecord(stop, nullptr));
    GRADSYNC_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    GRADSYNC_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

TEST(DeviceReduceBandwidth, AgainstTheDevicesCopyBandwidth) {
  DeviceMemory source(kBytes);
  DeviceMemory destination(kBytes);
  GRADSYNC_CUDA_CHECK(cudaMemset(source.data(), 0, kBytes));
  const float copy_ms = median_ms([&] {
    GRADSYNC_CUDA_CHECK(
        cudaMemcpyAsync(destination.data(), source.data(), kBytes, cudaMemcpyDeviceToDevice));
  });
  const double copy_gbps = 2.0 * kBytes / (copy_ms * 1e6);  // read + write
  std::printf("device copy: %.1f GB/s of traffic (256 MiB, median of %d)\n", copy_gbps, kRepeats);

  for (const int inputs : {2, 4, 8}) {
    std::vector<std::unique_ptr<DeviceMemory>> buffers;
    std::vector<const void*> in_ptrs;
    for (int r = 0; r < inputs; ++r) {
      buffers.push_back(std::make_unique<DeviceMemory>(kBytes / inputs));
      const std::vector<float> values(kBytes / inputs / sizeof(float), 1.0f + r);
      buffers.back()->upload(
          std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(values.data()),
                               reinterpret_cast<const uint8_t*>(values.data()) + kBytes / inputs));
      in_ptrs.push_back(buffers.back()->data());
    }
    void* output = destination.data();
    const size_t count = kBytes / inputs / sizeof(float);
    const float ms = median_ms([&] {
      GRADSYNC_CUDA_CHECK(kernels::cuda::reduce_to_all(
          GRADSYNC_FLOAT32, GRADSYNC_SUM, in_ptrs.data(), inputs, &output, 1, count, nullptr));
    });
    // Traffic: K inputs read, one output written, each kBytes / K.
    const size_t input_bytes = kBytes / inputs;  // whole: kBytes is a multiple of 8
    const double gbps = (inputs + 1.0) * static_cast<double>(input_bytes) / (ms * 1e6);
    std::printf("reduce f32 sum, %d inputs of %zu MiB: %.1f GB/s of traffic, %.0f%% of copy\n",
                inputs, kBytes / inputs >> 20, gbps, 100.0 * gbps / copy_gbps);
    const std::vector<uint8_t> result = destination.download(0, sizeof(float));
    float first = 0;
    std::memcpy(&first, result.data(), sizeof(first));
    EXPECT_EQ(first, inputs * (inputs + 1) / 2.0f);
  }
}

}  // namespace
}  // namespace gradsync::gpu_testing
