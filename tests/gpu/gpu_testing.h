// Helpers of the GPU tests (tests/gpu): device buffers with RAII, checked calls, the IPC child.
#pragma once

#include "daemon/device/cuda_check.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradsync::gpu_testing {

inline constexpr const char* kIpcChildFlag = "--ipc-child";
inline constexpr const char* kRankChildFlag = "--rank-child";

// The second process of ipc_test.cpp: opens a handle given on the command line through the
// daemon's Devices, reduces in the memory, and checks what the daemon must refuse.
int ipc_child(int argc, char** argv);
// A rank of daemon_collectives_test.cpp (its identity in the environment).
int rank_child();

// cudaMalloc'd memory, freed on destruction.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) {
    GRADSYNC_CUDA_CHECK(cudaMalloc(&data_, bytes));
  }
  ~DeviceMemory() { (void)cudaFree(data_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  size_t bytes() const { return bytes_; }
  void upload(const std::vector<uint8_t>& host, size_t offset = 0) {
    GRADSYNC_CUDA_CHECK(
        cudaMemcpy(data() + offset, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  std::vector<uint8_t> download(size_t offset, size_t bytes) const {
    std::vector<uint8_t> host(bytes);
    GRADSYNC_CUDA_CHECK(cudaMemcpy(host.data(), data() + offset, bytes, cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

// Device memory from the VMM API, as PyTorch's expandable segments make it: `segments`
// physical allocations of equal size (a multiple of the device's granularity, together at
// least `min_bytes`), each exportable as a POSIX fd, mapped one after another in one reserved
// range. The driver's entry points come through the runtime: the tests link no libcuda, so
// that they start, and skip, where there is none.
class VmmMemory {
 public:
  VmmMemory(size_t min_bytes, int segments);
  ~VmmMemory();
  VmmMemory(const VmmMemory&) = delete;
  VmmMemory& operator=(const VmmMemory&) = delete;
  uint8_t* data() const {
    return reinterpret_cast<uint8_t*>(base_);  // NOLINT(performance-no-int-to-ptr): an address
  }
  size_t bytes() const { return bytes_; }
  size_t segment_bytes() const { return segment_bytes_; }

 private:
  unsigned long long base_ = 0;  // NOLINT(google-runtime-int): CUdeviceptr
  size_t bytes_ = 0;
  size_t segment_bytes_ = 0;
  std::vector<unsigned long long> handles_;  // NOLINT(google-runtime-int)
};

// Page-locked host memory (cudaMallocHost): asynchronous copies from it return at once, so the
// host truly runs ahead of the stream.
class PinnedMemory {
 public:
  explicit PinnedMemory(size_t bytes) { GRADSYNC_CUDA_CHECK(cudaMallocHost(&data_, bytes)); }
  ~PinnedMemory() { (void)cudaFreeHost(data_); }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(data_); }

 private:
  void* data_ = nullptr;
};

}  // namespace gradsync::gpu_testing
