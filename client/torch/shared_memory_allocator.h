// PyTorch's CPU allocator, once a process opts in (gradsync.torch.use_shared_memory): tensors
// of at least a threshold are allocated from a gradsync heap of the process (gradsync_heap_create)
// that every gradsync process group's communicator is attached to, so the backend's
// collectives run on them where they lie instead of copying them into staging memory and back.
// Smaller tensors, and any the heap cannot hold, come from PyTorch's own allocator.
#pragma once

#include <c10/core/Allocator.h>
#include <gradsync/gradsync.hpp>

#include <ATen/ATen.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <utility>

namespace gradsync::torch_backend {

class SharedMemoryAllocator final : public c10::Allocator {
 public:
  // The process's one. c10 keeps a plain pointer to its CPU allocator for the life of the
  // process, and tensors are freed until the very end of it (after static destructors run),
  // so it is never destroyed.
  static SharedMemoryAllocator& instance();

  // Serves CPU tensors of `min_bytes` bytes or more from the heap from now on; 0 stops (the
  // tensors already allocated stay where they are). The first call installs this allocator as
  // PyTorch's CPU allocator; like any change of it, it belongs before the threads that
  // allocate start (c10::SetAllocator is not thread-safe).
  void serve_from(size_t min_bytes);

  // The heap every process group's communicator attaches.
  const gradsync::Heap& heap() const { return heap_; }

  // Whether `tensor` lies in the heap's memory.
  static bool holds(const at::Tensor& tensor);

  // c10::Allocator's interface differs between PyTorch releases: 1.13 declares allocate const
  // and has no copy_data; later releases make allocate non-const and copy_data pure. Both
  // forms are defined, and no member says `override` (one that did would make the compiler
  // ask it of the others, which override in one release only), so that whichever the headers
  // declare is overridden: scripts/build-torch-backend builds against a GPU host's PyTorch.
  // NOLINTBEGIN(modernize-use-override)
  c10::DataPtr allocate(size_t bytes) const;
  c10::DataPtr allocate(size_t bytes) { return std::as_const(*this).allocate(bytes); }
  void copy_data(void* dest, const void* src, size_t count) const;
  c10::DeleterFnPtr raw_deleter() const { return &free_raw; }
  // NOLINTEND(modernize-use-override)

 private:
  SharedMemoryAllocator() = default;
  // The deleter of the heap's tensors. In a child the process forked (a DataLoader's worker)
  // it leaves the parent's memory alone (shared_heap.h).
  static void free_shared(void* ptr);
  // raw_allocate's deleter (oneDNN's scratch memory comes that way), which hands out memory
  // of either kind under one deleter, as does any allocation made before this allocator was.
  static void free_raw(void* ptr);

  gradsync::Heap heap_;
  c10::Allocator* fallback_ = nullptr;  // PyTorch's own, set once when installed
  std::atomic<size_t> min_bytes_{0};    // 0: nothing from the heap
  std::once_flag installed_;
};

}  // namespace gradsync::torch_backend
