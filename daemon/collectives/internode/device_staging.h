// A collective across nodes on device memory, staged through page-locked host memory: the
// local ranks' device buffers go to one host buffer on the daemon's streams (an allreduce's
// reduced on the devices first, so one buffer crosses the bus, not one per rank), the
// algorithm across nodes runs on that buffer exactly as on host memory, and the result comes
// back to every rank's device buffer. The engine thread never waits for a GPU: the task
// suspends on each transfer's fence.
//
//   DeviceStage stage({&collective}, streams, world_size);
//   if (auto error = co_await stage.to_host()) co_return error;
//   ... run the collective across nodes on stage.host() ...
//   if (auto error = co_await stage.to_devices()) co_return error;
//
// Small allreduces fuse as on host memory, packed: each is reduced on the devices and copied
// to its place in one host buffer, and the batch crosses the network as one collective.
#pragma once

#include "daemon/device/device_streams.h"
#include "daemon/job/ready_unit.h"
#include "daemon/links/node_task.h"

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

// A large device allreduce across nodes is staged in pieces, so that the copies of one piece
// overlap the network transfers of another (double buffering): piece i+1 goes to host memory
// and piece i-1 back to the devices while piece i crosses the network. Every node cuts alike:
// what this depends on (count, dtype, device memory) is agreed.
struct StagingPieces {
  uint64_t count = 1;     // pieces; each takes a sequence number of its own
  uint64_t elements = 0;  // in each (the last may have fewer)
};
inline constexpr uint64_t kStagingPieceBytes = uint64_t{4} << 20;
inline constexpr uint64_t kMaxStagingPieces = 16;
// One piece for anything but an allreduce on device memory.
StagingPieces staging_pieces(const ReadyCollective& collective);

// Waits for the writes of stream-ordered ranks (ranks_written) before a stage copies from their
// memory. Never fails: a query that fails is reported by the copies' own wait.
class WrittenWait final : public NodeWait {
 public:
  WrittenWait(DeviceStreams& streams, std::vector<const ReadyCollective*> collectives)
      : streams_(&streams), collectives_(std::move(collectives)) {}
  bool ready() override;
  NodeResult take_result() { return std::nullopt; }

 private:
  DeviceStreams* streams_;
  std::vector<const ReadyCollective*> collectives_;
  size_t written_ = 0;  // collectives known written
};

class DeviceStage {
 public:
  // `collectives`: on device memory, of a job of `world_size` ranks, their ranks' global ranks
  // in their sessions: one allreduce, broadcast, allgather, reduce-scatter or all-to-all (the
  // last two with each rank's whole send and receive ranges staged), or several allreduces of one
  // dtype (a fused batch), packed one after the other in the host buffer. Takes the host buffer
  // from the streams' pool; throws DeviceError if there is none.
  DeviceStage(const std::vector<const ReadyCollective*>& collectives, DeviceStreams& streams,
              int32_t world_size);
  // What the device work enqueued may still touch (the host buffer, the ranks' mappings) is
  // kept by the streams until it is done: a job that fails does not wait for a GPU.
  ~DeviceStage();
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  // The collectives as the algorithms across nodes see them: the same ranks, their buffers in
  // host memory (an allreduce's one rank contributing for the node).
  const ReadyCollective& host(size_t i = 0) const { return members_[i].host; }
  std::vector<const ReadyCollective*> hosts() const;
  // The host buffer: the packed allreduces' elements one after the other.
  uint8_t* buffer() const { return buffer_.get(); }

  // Until the stream-ordered ranks' writes are done: before to_host, so that the daemon's
  // streams need not wait on the ranks' events.
  NodeAwait<WrittenWait> ranks_written() const;
  // Enqueues this node's part into the host buffer, after the stream-ordered ranks' ready
  // events.
  NodeAwait<FenceWait> to_host();
  // Enqueues the results from the host buffer into every rank's receive buffer, then records
  // the stream-ordered ranks' completion events.
  NodeAwait<FenceWait> to_devices();

  // One allreduce in pieces: elements [begin, end) of it. The ready events are waited for with
  // the piece that begins at 0, the completion events recorded with the one that ends at its
  // count. Pieces enqueued in order: each fence is reached after the ones before it.
  NodeAwait<FenceWait> to_host(uint64_t begin, uint64_t end);
  NodeAwait<FenceWait> to_devices(uint64_t begin, uint64_t end);
  // Elements [begin, end) of the allreduce in host memory, as the algorithms see a collective.
  ReadyCollective piece(uint64_t begin, uint64_t end) const;

 private:
  struct Member {
    const ReadyCollective* collective;
    uint64_t offset;  // in the host buffer
    uint64_t bytes;   // there
    std::vector<int> devices;
    ReadyCollective host;
  };
  // Enqueues `enqueue` and a fence after it.
  template <typename Enqueue>
  NodeAwait<FenceWait> transfer(Enqueue&& enqueue);
  // Elements [begin, end) of an allreduce member; the whole of any other.
  void stage_in(const Member& member, uint64_t begin, uint64_t end);
  void stage_out(const Member& member, uint64_t begin, uint64_t end);

  DeviceStreams& streams_;
  int32_t world_size_;
  std::shared_ptr<uint8_t> buffer_;
  std::vector<Member> members_;
  std::optional<DeviceStreams::Fence> last_fence_;
};

}  // namespace gradsync::daemon
