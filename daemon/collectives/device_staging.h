// A collective across nodes on device memory, staged through page-locked host memory: the
// local ranks' device buffers go to one host buffer on the daemon's streams (an allreduce's
// reduced on the devices first, so one buffer crosses the bus, not one per rank), the
// algorithm across nodes runs on that buffer exactly as on host memory, and the result comes
// back to every rank's device buffer. The engine thread never waits for a GPU: the task
// suspends on each transfer's fence.
//
//   DeviceStage stage(collective, streams);
//   if (auto error = co_await stage.to_host()) co_return error;
//   ... run the collective across nodes on stage.host() ...
//   if (auto error = co_await stage.to_devices()) co_return error;
#pragma once

#include "daemon/device/device_streams.h"
#include "daemon/job.h"
#include "daemon/node/node_task.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::daemon {

// Waits for the device work before a fence; the error if it failed, or could not be enqueued.
class FenceWait final : public NodeWait {
 public:
  FenceWait(DeviceStreams& streams, DeviceStreams::Fence fence)
      : streams_(&streams), fence_(fence) {}
  explicit FenceWait(std::string error) : error_(std::move(error)) {}
  bool ready() override;
  NodeResult take_result() { return std::move(error_); }

 private:
  DeviceStreams* streams_ = nullptr;  // null: failed before anything was enqueued
  DeviceStreams::Fence fence_ = 0;
  NodeResult error_;
};

class DeviceStage {
 public:
  // `collective`: on device memory, an allreduce, broadcast or allgather of a job of
  // `world_size` ranks, its ranks' global ranks in their sessions. Takes the host buffer from
  // the streams' pool; throws DeviceError if there is none.
  DeviceStage(const ReadyCollective& collective, DeviceStreams& streams, int32_t world_size);
  // What the device work enqueued may still touch (the host buffer, the ranks' mappings) is
  // kept by the streams until it is done: a job that fails does not wait for a GPU.
  ~DeviceStage();
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  // The collective as the algorithms across nodes see it: the same ranks, their buffers in
  // host memory.
  const ReadyCollective& host() const { return host_; }

  // Enqueues this node's part into host(), after the stream-ordered ranks' ready events.
  NodeAwait<FenceWait> to_host();
  // Enqueues the result from host() into every rank's receive buffer, then records the
  // stream-ordered ranks' completion events.
  NodeAwait<FenceWait> to_devices();

 private:
  // Enqueues `enqueue` and a fence after it.
  template <typename Enqueue>
  NodeAwait<FenceWait> transfer(Enqueue&& enqueue);
  void stage_in();
  void stage_out();

  const ReadyCollective& collective_;
  DeviceStreams& streams_;
  std::vector<int> devices_;
  uint64_t bytes_ = 0;  // of the host buffer
  std::shared_ptr<uint8_t> buffer_;
  ReadyCollective host_;
  std::optional<DeviceStreams::Fence> last_fence_;
};

}  // namespace gradsync::daemon
