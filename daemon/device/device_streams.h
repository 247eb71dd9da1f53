// The daemon's own streams, one per device, on which it runs device collectives, and the
// fences the engine polls to learn that they are done: the engine thread never blocks on a
// GPU. CUDA builds implement it in cuda_streams.cpp; without CUDA every call throws (no device
// memory is ever registered there to call it with).
#pragma once

#include "daemon/device/devices.h"

#include <gradsync/gradsync.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gradsync::daemon {

inline constexpr size_t kIpcEventBytes = 64;  // cudaIpcEventHandle_t
using IpcEventBytes = std::array<uint8_t, kIpcEventBytes>;
// The most event slots a client may register: each is a pair of interprocess events, which
// the driver limits.
inline constexpr size_t kMaxEventSlots = 256;

// One client's events: its ready events, opened here, and the daemon's completion events, one
// per slot, made on the client's device. Freed with the last reference (work in flight that
// uses them holds one).
struct ClientEvents;

// Opens `ready` and makes as many completion events on `device` (UUID); their handles go to
// `completion`. Throws DeviceError.
std::shared_ptr<const ClientEvents> open_client_events(const Devices& devices,
                                                       const DeviceUuid& device,
                                                       const std::vector<IpcEventBytes>& ready,
                                                       std::vector<IpcEventBytes>& completion);
size_t event_slots(const ClientEvents& events);
// The ordinal of the device the client's events live on.
int events_device(const ClientEvents& events);

class DeviceStreams {
 public:
  using Fence = uint64_t;

  explicit DeviceStreams(const Devices& devices);
  // Waits for the work enqueued (the memory it touches must outlive it), then frees it all.
  ~DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  // The most inputs, and outputs, one reduce takes.
  static size_t max_operands();

  // Enqueue on `device`'s stream (ordinals as in Devices). Throw DeviceError.
  void reduce(int device, gradsync_dtype dtype, gradsync_op op, const void* const* inputs,
              size_t num_inputs, void* const* outputs, size_t num_outputs, size_t count);
  void copy(int device, void* destination, const void* source, size_t bytes);
  // Whether the client's ready event `slot`, as last recorded, is done: the writes before it
  // are. One found not done is remembered for take_writes_awaited. Throws DeviceError if
  // asking fails.
  bool ready_done(const ClientEvents& events, uint32_t slot);
  // Whether a ready_done since the last call found writes not done: someone waits for them,
  // and the engine polls again rather than sleep (the driver has no fd to wake it).
  bool take_writes_awaited();
  // `device`'s stream waits, from now on, for the client's ready event `slot` as last recorded
  // (no wait is enqueued where that event is done already).
  void wait_ready(int device, const ClientEvents& events, uint32_t slot);
  // The stream of `into` waits for everything enqueued so far on the others' streams.
  void join(int into, const std::vector<int>& devices);
  // Records the daemon's completion event `slot` on the stream of the events' device.
  void record_completion(const ClientEvents& events, uint32_t slot);

  // A point after everything enqueued since the last fence, on every stream that got work.
  Fence fence();
  // Whether the work before `fence` is done (it is then forgotten). Throws DeviceError if the
  // work failed.
  bool reached(Fence fence);
  // Whether any fence is not known to be reached: device work may still be running.
  bool pending() const;

  // Page-locked host memory of at least `bytes`, which every device's copies reach at full
  // speed: where collectives across nodes stage device memory for the network. Pooled: the
  // buffer goes back to the pool with its last reference (pinning memory costs milliseconds).
  // Throws DeviceError.
  std::shared_ptr<uint8_t> pinned(size_t bytes);
  // Keeps `memory` until the work before `fence` is done: what a piece of work given up early
  // (its job failed) enqueued may still touch it. collect() lets it go.
  void release_after(Fence fence, std::vector<std::shared_ptr<const void>> memory);
  bool holding() const;
  // Lets go of what release_after kept whose fence is reached (or whose work failed); true if
  // it let go of anything.
  bool collect();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace gradsync::daemon
