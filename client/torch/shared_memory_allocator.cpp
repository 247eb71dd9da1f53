#include "client/torch/shared_memory_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <cstring>

namespace gradsync::torch_backend {

SharedMemoryAllocator& SharedMemoryAllocator::instance() {
  static auto* const allocator = new SharedMemoryAllocator();  // never destroyed (see the header)
  return *allocator;
}

void SharedMemoryAllocator::serve_from(size_t min_bytes) {
  std::call_once(installed_, [this] {
    fallback_ = c10::GetCPUAllocator();
    // The default allocator is registered at priority 0; higher keeps another library's
    // later registration at the default priority from displacing this one.
    c10::SetCPUAllocator(this, /*priority=*/1);
  });
  min_bytes_.store(min_bytes, std::memory_order_relaxed);
}

bool SharedMemoryAllocator::holds(const at::Tensor& tensor) {
  return tensor.device().is_cpu() && tensor.has_storage() &&
         tensor.storage().data_ptr().get_deleter() == &free_shared;
}

c10::DataPtr SharedMemoryAllocator::allocate(size_t bytes) const {
  const size_t min_bytes = min_bytes_.load(std::memory_order_relaxed);
  if (min_bytes != 0 && bytes >= min_bytes) {
    void* ptr = nullptr;
    if (gradsync_heap_alloc(heap_.get(), bytes, &ptr) == GRADSYNC_OK) {
      return {ptr, ptr, &free_shared, c10::Device(c10::kCPU)};
    }
    // Out of shared memory: PyTorch's own memory serves, and its collectives are staged.
  }
  return fallback_->allocate(bytes);
}

void SharedMemoryAllocator::copy_data(void* dest, const void* src, size_t count) const {
  std::memcpy(dest, src, count);
}

void SharedMemoryAllocator::free_shared(void* ptr) {
  // Fails only for memory the heap did not allocate, which this deleter is never given.
  gradsync_heap_free(instance().heap_.get(), ptr);
}

void SharedMemoryAllocator::free_raw(void* ptr) {
  // Asked first rather than freed and failed: most raw allocations are small scratch memory
  // of PyTorch's, and a refused free builds an error message.
  SharedMemoryAllocator& self = instance();
  if (gradsync_heap_contains(self.heap_.get(), ptr, 1) != 0) {
    gradsync_heap_free(self.heap_.get(), ptr);
  } else {
    self.fallback_->raw_deleter()(ptr);
  }
}

}  // namespace gradsync::torch_backend
