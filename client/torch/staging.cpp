#include "client/torch/staging.h"

#include <algorithm>
#include <utility>

namespace gradsync::torch_backend {
namespace {

constexpr size_t kPageBytes = 4096;

size_t page_rounded(size_t bytes) {
  return std::max<size_t>(kPageBytes, (bytes + kPageBytes - 1) / kPageBytes * kPageBytes);
}

}  // namespace

SharedBuffer StagingPool::acquire(size_t bytes) {
  const size_t size = page_rounded(bytes);
  auto it = idle_.find(size);
  if (it != idle_.end() && !it->second.empty()) {
    SharedBuffer buffer = std::move(it->second.back());
    it->second.pop_back();
    return buffer;
  }
  return comm_.allocate(size);
}

void StagingPool::release(SharedBuffer buffer) {
  auto& idle = idle_[buffer.size()];
  if (idle.size() < kIdlePerSize) idle.push_back(std::move(buffer));
}

}  // namespace gradsync::torch_backend
