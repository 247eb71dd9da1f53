// DeviceStreams over the CUDA runtime: a non-blocking stream per device, created on first use;
// fences are events from a per-device pool (creating events costs more than recording them).
#include "daemon/device/cuda_check.h"
#include "daemon/device/device_streams.h"
#include "kernels/cuda/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace gradsync::daemon {

struct ClientEvents {
  int device = 0;
  std::vector<cudaEvent_t> ready;       // opened from the client's handles
  std::vector<cudaEvent_t> completion;  // made here, interprocess
  ClientEvents() = default;
  ClientEvents(const ClientEvents&) = delete;
  ClientEvents& operator=(const ClientEvents&) = delete;
  ~ClientEvents() {
    try {
      const DeviceScope scope(device);
      for (cudaEvent_t event : ready) (void)cudaEventDestroy(event);
      for (cudaEvent_t event : completion) (void)cudaEventDestroy(event);
    } catch (const DeviceError&) {  // the device is gone, and the events with it
    }
  }
};

std::shared_ptr<const ClientEvents> open_client_events(const Devices& devices,
                                                       const DeviceUuid& device,
                                                       const std::vector<IpcEventBytes>& ready,
                                                       std::vector<IpcEventBytes>& completion) {
  const auto& known = devices.devices();
  const auto it = std::find_if(known.begin(), known.end(),
                               [&](const DeviceInfo& d) { return d.uuid == device; });
  if (it == known.end()) {
    throw DeviceError(fmt::format("events on device {}, which is not one of this node's: {}",
                                  format_uuid(device), devices.summary()));
  }
  if (ready.empty() || ready.size() > kMaxEventSlots) {
    throw DeviceError(
        fmt::format("{} event slots; 1 to {} are allowed", ready.size(), kMaxEventSlots));
  }
  auto events = std::make_shared<ClientEvents>();
  events->device = it->ordinal;
  const DeviceScope scope(it->ordinal);
  completion.clear();
  for (const IpcEventBytes& bytes : ready) {
    cudaIpcEventHandle_t handle{};
    static_assert(sizeof(handle.reserved) == kIpcEventBytes);
    std::memcpy(handle.reserved, bytes.data(), kIpcEventBytes);
    cudaEvent_t event = nullptr;
    GRADSYNC_CUDA_CHECK(cudaIpcOpenEventHandle(&event, handle));
    events->ready.push_back(event);
    cudaEvent_t mine = nullptr;
    GRADSYNC_CUDA_CHECK(
        cudaEventCreateWithFlags(&mine, cudaEventDisableTiming | cudaEventInterprocess));
    events->completion.push_back(mine);
    cudaIpcEventHandle_t exported{};
    GRADSYNC_CUDA_CHECK(cudaIpcGetEventHandle(&exported, mine));
    IpcEventBytes out{};
    std::memcpy(out.data(), exported.reserved, kIpcEventBytes);
    completion.push_back(out);
  }
  return events;
}

size_t event_slots(const ClientEvents& events) {
  return events.ready.size();
}

int events_device(const ClientEvents& events) {
  return events.device;
}

namespace {

// Page-locked host buffers kept for reuse, by capacity: collectives across nodes stage the same
// sizes step after step. A buffer comes back to the pool with its last reference, which may be
// dropped after the streams are gone (UCX keeps what a failed collective handed it), so each
// holds the pool.
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  // What the pool keeps unused at most; a buffer returned past it is freed.
  static constexpr size_t kMaxFreeBytes = size_t{512} << 20;
  static constexpr size_t kGranule = size_t{1} << 20;

  explicit PinnedPool(int device) : device_(device) {}
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;
  ~PinnedPool() {
    for (auto& [capacity, data] : free_) (void)cudaFreeHost(data);
  }

  std::shared_ptr<uint8_t> take(size_t bytes) {
    const size_t wanted = std::max<size_t>(1, (bytes + kGranule - 1) / kGranule) * kGranule;
    uint8_t* data = nullptr;
    size_t capacity = wanted;
    {
      const std::lock_guard lock(mutex_);
      // The smallest free buffer that fits, unless it would waste more than it holds.
      if (const auto it = free_.lower_bound(wanted); it != free_.end() && it->first <= 2 * wanted) {
        capacity = it->first;
        data = it->second;
        free_bytes_ -= capacity;
        free_.erase(it);
      }
    }
    if (data == nullptr) {
      const DeviceScope scope(device_);
      void* allocated = nullptr;
      // Portable: every device's context sees it as pinned, not only the current one's.
      GRADSYNC_CUDA_CHECK(cudaHostAlloc(&allocated, capacity, cudaHostAllocPortable));
      data = static_cast<uint8_t*>(allocated);
    }
    return {data,
            [pool = shared_from_this(), capacity](uint8_t* p) { pool->give_back(p, capacity); }};
  }

 private:
  void give_back(uint8_t* data, size_t capacity) {
    {
      const std::lock_guard lock(mutex_);
      if (free_bytes_ + capacity <= kMaxFreeBytes) {
        free_.emplace(capacity, data);
        free_bytes_ += capacity;
        return;
      }
    }
    (void)cudaFreeHost(data);
  }

  int device_;
  std::mutex mutex_;
  std::multimap<size_t, uint8_t*> free_;
  size_t free_bytes_ = 0;
};

}  // namespace

struct DeviceStreams::State {
  struct PerDevice {
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> free_events;
  };
  std::vector<PerDevice> devices;
  std::set<int> touched;  // devices with work since the last fence
  Fence next_fence = 1;
  std::map<Fence, std::vector<std::pair<int, cudaEvent_t>>> fences;
  std::shared_ptr<PinnedPool> pinned;  // made on first use
  std::vector<std::pair<Fence, std::vector<std::shared_ptr<const void>>>> held;
  bool writes_awaited = false;  // see take_writes_awaited

  PerDevice& at(int device) {
    if (device < 0 || static_cast<size_t>(device) >= devices.size()) {
      throw DeviceError(fmt::format("device {} is not one of this daemon's", device));
    }
    PerDevice& d = devices[static_cast<size_t>(device)];
    if (d.stream == nullptr) {
      const DeviceScope scope(device);
      GRADSYNC_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
    }
    touched.insert(device);
    return d;
  }
};

DeviceStreams::DeviceStreams(const Devices& devices) : state_(std::make_unique<State>()) {
  state_->devices.resize(devices.devices().size());
}

DeviceStreams::~DeviceStreams() {
  // The streams are synchronised below before anything they touch is freed: held memory last.
  const auto held = std::move(state_->held);
  for (size_t device = 0; device < state_->devices.size(); ++device) {
    State::PerDevice& d = state_->devices[device];
    if (d.stream == nullptr) continue;
    try {
      const DeviceScope scope(static_cast<int>(device));
      (void)cudaStreamSynchronize(d.stream);  // what it touches is freed after us
      for (auto& [fence, events] : state_->fences) {
        for (auto& [owner, event] : events) {
          if (owner == static_cast<int>(device)) (void)cudaEventDestroy(event);
        }
      }
      for (cudaEvent_t event : d.free_events) (void)cudaEventDestroy(event);
      (void)cudaStreamDestroy(d.stream);
    } catch (const DeviceError&) {  // the device is gone, and its streams with it
    }
  }
}

size_t DeviceStreams::max_operands() {
  return kernels::cuda::kMaxOperands;
}

void DeviceStreams::reduce(int device, gradsync_dtype dtype, gradsync_op op,
                           const void* const* inputs, size_t num_inputs, void* const* outputs,
                           size_t num_outputs, size_t count) {
  State::PerDevice& d = state_->at(device);
  const DeviceScope scope(device);
  GRADSYNC_CUDA_CHECK(kernels::cuda::reduce_to_all(dtype, op, inputs, num_inputs, outputs,
                                                   num_outputs, count, d.stream));
}

void DeviceStreams::copy(int device, void* destination, const void* source, size_t bytes) {
  State::PerDevice& d = state_->at(device);
  const DeviceScope scope(device);
  // cudaMemcpyDefault: unified addressing finds each side's device, peers included.
  GRADSYNC_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, d.stream));
}

bool DeviceStreams::ready_done(const ClientEvents& events, uint32_t slot) {
  const DeviceScope scope(events.device);
  const cudaError_t status = cudaEventQuery(events.ready.at(slot));
  if (status == cudaErrorNotReady) {
    state_->writes_awaited = true;
    return false;
  }
  GRADSYNC_CUDA_CHECK(status);
  return true;
}

bool DeviceStreams::take_writes_awaited() {
  return std::exchange(state_->writes_awaited, false);
}

void DeviceStreams::wait_ready(int device, const ClientEvents& events, uint32_t slot) {
  // Done already (the rank's writes were when it submitted, or the engine waited for them):
  // nothing to wait for. Without MPS a stream's wait on another process's event costs a
  // switch between the processes' contexts even when that event is done (about 0.15 ms on an
  // H200: BENCHMARKS.md, GPU), so only writes still in flight get one.
  if (ready_done(events, slot)) return;
  State::PerDevice& d = state_->at(device);
  const DeviceScope scope(device);
  GRADSYNC_CUDA_CHECK(cudaStreamWaitEvent(d.stream, events.ready.at(slot), 0));
}

void DeviceStreams::join(int into, const std::vector<int>& devices) {
  State::PerDevice& target = state_->at(into);
  for (const int device : devices) {
    if (device == into) continue;
    State::PerDevice& source = state_->at(device);
    const DeviceScope scope(device);
    cudaEvent_t event = nullptr;
    GRADSYNC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    GRADSYNC_CUDA_CHECK(cudaEventRecord(event, source.stream));
    const cudaError_t waited = cudaStreamWaitEvent(target.stream, event, 0);
    (void)cudaEventDestroy(event);  // released once the work it marks is done
    GRADSYNC_CUDA_CHECK(waited);
  }
}

void DeviceStreams::record_completion(const ClientEvents& events, uint32_t slot) {
  State::PerDevice& d = state_->at(events.device);
  const DeviceScope scope(events.device);
  GRADSYNC_CUDA_CHECK(cudaEventRecord(events.completion.at(slot), d.stream));
}

DeviceStreams::Fence DeviceStreams::fence() {
  const Fence fence = state_->next_fence++;
  auto& events = state_->fences[fence];
  for (const int device : state_->touched) {
    State::PerDevice& d = state_->devices[static_cast<size_t>(device)];
    const DeviceScope scope(device);
    cudaEvent_t event = nullptr;
    if (d.free_events.empty()) {
      GRADSYNC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } else {
      event = d.free_events.back();
      d.free_events.pop_back();
    }
    events.emplace_back(device, event);
    GRADSYNC_CUDA_CHECK(cudaEventRecord(event, d.stream));
  }
  state_->touched.clear();
  return fence;
}

bool DeviceStreams::reached(Fence fence) {
  const auto it = state_->fences.find(fence);
  if (it == state_->fences.end()) return true;
  for (const auto& [device, event] : it->second) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaErrorNotReady) return false;
    GRADSYNC_CUDA_CHECK(status);
  }
  for (const auto& [device, event] : it->second) {
    state_->devices[static_cast<size_t>(device)].free_events.push_back(event);
  }
  state_->fences.erase(it);
  return true;
}

std::shared_ptr<uint8_t> DeviceStreams::pinned(size_t bytes) {
  if (state_->devices.empty()) throw DeviceError("no device to pin host memory for");
  if (!state_->pinned) state_->pinned = std::make_shared<PinnedPool>(0);
  return state_->pinned->take(bytes);
}

void DeviceStreams::release_after(Fence fence, std::vector<std::shared_ptr<const void>> memory) {
  state_->held.emplace_back(fence, std::move(memory));
}

bool DeviceStreams::pending() const {
  return !state_->fences.empty();
}

bool DeviceStreams::holding() const {
  return !state_->held.empty();
}

bool DeviceStreams::collect() {
  auto& held = state_->held;
  const auto kept = std::remove_if(held.begin(), held.end(), [this](const auto& entry) {
    try {
      return reached(entry.first);
    } catch (const DeviceError&) {  // the work failed: it touches nothing any more
      return true;
    }
  });
  const bool released = kept != held.end();
  held.erase(kept, held.end());
  return released;
}

}  // namespace gradsync::daemon
