// Registered memory a collective's bytes pass through. The daemon reads and writes only memory
// a communicator registered: for CPU tensors, shared host memory; for CUDA tensors, a buffer
// on the tensors' own GPU, which the daemon opens through CUDA IPC and reduces in place, so
// that a CUDA tensor's bytes never cross to the host on one node. Buffers are pooled by device
// and size, so a training loop with stable shapes (DDP's buckets) registers each once.
#pragma once

#include <ATen/ATen.h>
#include <gradsync/gradsync.hpp>

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace gradsync::torch_backend {

class StagingBuffer {
 public:
  explicit StagingBuffer(SharedBuffer host);
  StagingBuffer(at::Tensor device_memory, DeviceRegistration registration);

  std::byte* data() const;
  size_t size() const;
  c10::Device device() const;

 private:
  SharedBuffer host_;         // for the host
  at::Tensor device_memory_;  // for a GPU: holds the allocation
  // Unregistered before the memory goes back to PyTorch's allocator (members end in reverse).
  std::unique_ptr<DeviceRegistration> registration_;
};

class StagingPool {
 public:
  explicit StagingPool(gradsync::Communicator& comm) : comm_(comm) {}

  // A buffer of at least `bytes` bytes on `device`, from the pool or freshly registered. The
  // caller makes `device` current for a GPU.
  StagingBuffer acquire(size_t bytes, c10::Device device);
  // Back into the pool, for the next collective of its size on its device.
  void release(StagingBuffer buffer);

 private:
  // Idle buffers kept per size: enough for the buckets of one step in flight together.
  static constexpr size_t kIdlePerSize = 8;
  using Key = std::tuple<int, int, size_t>;  // device type, device index, bytes
  static Key key_of(c10::Device device, size_t bytes);

  gradsync::Communicator& comm_;
  std::map<Key, std::vector<StagingBuffer>> idle_;
};

}  // namespace gradsync::torch_backend
