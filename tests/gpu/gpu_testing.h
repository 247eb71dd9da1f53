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
