// Registered shared memory for host tensors. The daemon reads and writes only memory a
// communicator registered, so a CPU tensor's bytes pass through one of these buffers; they are
// pooled by size, so a training loop with stable shapes (DDP's buckets) registers each once.
#pragma once

#include <gradsync/gradsync.hpp>

#include <cstddef>
#include <map>
#include <vector>

namespace gradsync::torch_backend {

class StagingPool {
 public:
  explicit StagingPool(gradsync::Communicator& comm) : comm_(comm) {}

  // A buffer of at least `bytes` bytes, from the pool or freshly registered.
  SharedBuffer acquire(size_t bytes);
  // Back into the pool, for the next collective of its size.
  void release(SharedBuffer buffer);

 private:
  // Idle buffers kept per size: enough for the buckets of one step in flight together.
  static constexpr size_t kIdlePerSize = 8;

  gradsync::Communicator& comm_;
  std::map<size_t, std::vector<SharedBuffer>> idle_;  // by size
};

}  // namespace gradsync::torch_backend
