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

StagingBuffer::StagingBuffer(SharedBuffer host) : host_(std::move(host)) {}

StagingBuffer::StagingBuffer(at::Tensor device_memory, DeviceRegistration registration)
    : device_memory_(std::move(device_memory)),
      registration_(std::make_unique<DeviceRegistration>(std::move(registration))) {}

std::byte* StagingBuffer::data() const {
  return device_memory_.defined() ? static_cast<std::byte*>(device_memory_.data_ptr())
                                  : host_.as<std::byte>();
}

size_t StagingBuffer::size() const {
  return device_memory_.defined() ? static_cast<size_t>(device_memory_.numel()) : host_.size();
}

c10::Device StagingBuffer::device() const {
  return device_memory_.defined() ? device_memory_.device() : c10::Device(c10::kCPU);
}

StagingPool::Key StagingPool::key_of(c10::Device device, size_t bytes) {
  return {static_cast<int>(device.type()), static_cast<int>(device.index()), bytes};
}

StagingBuffer StagingPool::acquire(size_t bytes, c10::Device device) {
  const size_t size = page_rounded(bytes);
  auto it = idle_.find(key_of(device, size));
  if (it != idle_.end() && !it->second.empty()) {
    StagingBuffer buffer = std::move(it->second.back());
    it->second.pop_back();
    return buffer;
  }
  if (device.is_cpu()) return StagingBuffer(comm_.allocate(size));
  at::Tensor memory =
      at::empty({static_cast<int64_t>(size)}, at::TensorOptions().dtype(at::kByte).device(device));
  DeviceRegistration registration = comm_.register_device(memory.data_ptr(), size);
  return {std::move(memory), std::move(registration)};
}

void StagingPool::release(StagingBuffer buffer) {
  auto& idle = idle_[key_of(buffer.device(), buffer.size())];
  if (idle.size() < kIdlePerSize) idle.push_back(std::move(buffer));
}

}  // namespace gradsync::torch_backend
