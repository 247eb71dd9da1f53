// The daemon's own streams, one per device, on which it runs device collectives, and the
// fences the engine polls to learn that they are done: the engine thread never blocks on a
// GPU. CUDA builds implement it in cuda_streams.cpp; without CUDA every call throws (no device
// memory is ever registered there to call it with).
#pragma once

#include "daemon/device/devices.h"

#include <gradsync/gradsync.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace gradsync::daemon {

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

  // A point after everything enqueued since the last fence, on every stream that got work.
  Fence fence();
  // Whether the work before `fence` is done (it is then forgotten). Throws DeviceError if the
  // work failed.
  bool reached(Fence fence);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace gradsync::daemon
