// Where gradsync-bench's size sweep keeps its send and receive buffers: host memory shared with
// the daemon, or (--device) memory on the rank's GPU, registered as device memory. Inputs are
// written and results read through host memory either way; with device buffers the copies
// between the two lie outside the timed collectives.
#pragma once

#include <gradsync/gradsync.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace gradsync::bench {

class SweepBuffers {
 public:
  virtual ~SweepBuffers() = default;
  // What the collectives are handed.
  virtual void* send() = 0;
  virtual void* recv() = 0;
  // Host memory to write the inputs into; upload() makes the first `bytes` the send buffer's.
  virtual void* staged_input() = 0;
  virtual void upload(size_t bytes) = 0;
  // The first `bytes` of `buffer` (send() or recv()), readable on the host.
  virtual const void* download(const void* buffer, size_t bytes) = 0;
  // After a collective's wait: returns once its result is in place. Where collectives are
  // ordered on a stream, once the stream's work is done too, so that the iteration's time
  // covers it.
  virtual void finish() {}
  virtual const char* memory() const = 0;  // "host" or "device"
};

// Two buffers of `bytes` in host memory shared with the daemon: no copies.
std::unique_ptr<SweepBuffers> make_host_buffers(Communicator& comm, size_t bytes);
// Two buffers of `bytes` on CUDA device `local_rank` mod the device count; `stream_ordered`:
// the communicator's device collectives ordered on a stream of the buffers' own while they
// live. Throws Error with GRADSYNC_ERR_UNSUPPORTED where the build has no CUDA or no device is
// usable.
std::unique_ptr<SweepBuffers> make_device_buffers(Communicator& comm, size_t bytes, int local_rank,
                                                  bool stream_ordered);

}  // namespace gradsync::bench
