#include "daemon/collectives/device_staging.h"

#include "daemon/collectives/device_work.h"
#include "daemon/collectives/node_collectives.h"

#include <utility>

namespace gradsync::daemon {
namespace {

int32_t rank_of(const Submission& s) {
  return s.session->identity().rank;
}

}  // namespace

bool FenceWait::ready() {
  if (streams_ == nullptr) return true;
  try {
    return streams_->reached(fence_);
  } catch (const DeviceError& e) {
    error_ = std::string("device work failed: ") + e.what();
    return true;
  }
}

DeviceStage::DeviceStage(const ReadyCollective& collective, DeviceStreams& streams,
                         int32_t world_size)
    : collective_(collective), streams_(streams), devices_(devices_of(collective)) {
  const Submission& lead = collective.first();
  const uint64_t block = lead.send_bytes();
  bytes_ = lead.collective == ipc::Collective::kAllgather
               ? block * static_cast<uint64_t>(world_size)
               : block;
  buffer_ = streams.pinned(bytes_);
  const std::shared_ptr<const void> keep = buffer_;
  host_.times = collective.times;
  host_.ranks.reserve(collective.ranks.size());
  for (const Submission& s : collective.ranks) {
    Submission& staged = host_.ranks.emplace_back(s);
    staged.device = kHostMemory;
    staged.event_slot = -1;
    staged.events.reset();
    staged.send_buffer = keep;
    staged.recv_buffer = keep;
    staged.recv = buffer_.get();
    // An allgather's ranks each own a slot of the buffer; the others' collectives share it
    // whole (a broadcast's root's data, an allreduce's node-wide sum).
    staged.send = lead.collective == ipc::Collective::kAllgather
                      ? buffer_.get() + static_cast<uint64_t>(rank_of(s)) * block
                      : buffer_.get();
    // An allreduce's ranks were reduced on the devices: one contributes for all.
    if (lead.collective == ipc::Collective::kAllreduce) break;
  }
}

DeviceStage::~DeviceStage() {
  if (!last_fence_) return;
  try {
    if (streams_.reached(*last_fence_)) return;
    std::vector<std::shared_ptr<const void>> memory{buffer_};
    collective_.append_memory(memory);
    streams_.release_after(*last_fence_, std::move(memory));
  } catch (const DeviceError&) {  // the work failed: it touches nothing any more
  }
}

template <typename Enqueue>
NodeAwait<FenceWait> DeviceStage::transfer(Enqueue&& enqueue) {
  try {
    enqueue();
    last_fence_ = streams_.fence();
    return {FenceWait(streams_, *last_fence_)};
  } catch (const DeviceError& e) {
    // Whatever was enqueued before the failure still runs: the destructor keeps its memory
    // until a fence after it.
    try {
      last_fence_ = streams_.fence();
    } catch (const DeviceError&) {  // the device is lost
    }
    return {FenceWait(std::string("device work failed: ") + e.what())};
  }
}

NodeAwait<FenceWait> DeviceStage::to_host() {
  return transfer([this] { stage_in(); });
}

NodeAwait<FenceWait> DeviceStage::to_devices() {
  return transfer([this] { stage_out(); });
}

void DeviceStage::stage_in() {
  wait_for_ranks(collective_, devices_, streams_);
  const Submission& lead = collective_.first();
  uint8_t* buffer = buffer_.get();
  switch (lead.collective) {
    case ipc::Collective::kAllreduce:
      if (collective_.ranks.size() == 1) {
        streams_.copy(lead.device, buffer, lead.send, bytes_);
        return;
      }
      // Summed, not averaged, on the node: the algorithm across nodes divides once at its end.
      reduce_on_devices(collective_, node_detail::network_op(lead.op), 1, streams_);
      streams_.join(lead.device, devices_);
      streams_.copy(lead.device, buffer, lead.recv, bytes_);
      return;
    case ipc::Collective::kBroadcast:
      for (const Submission& s : collective_.ranks) {
        if (rank_of(s) == lead.root) streams_.copy(s.device, buffer, s.send, bytes_);
      }
      return;
    case ipc::Collective::kAllgather:
      for (const Submission& s : collective_.ranks) {
        const uint64_t block = s.send_bytes();
        streams_.copy(s.device, buffer + static_cast<uint64_t>(rank_of(s)) * block, s.send, block);
      }
      return;
    case ipc::Collective::kBarrier:
      return;
  }
}

void DeviceStage::stage_out() {
  const Submission& lead = collective_.first();
  for (const Submission& s : collective_.ranks) {
    // A broadcast's root in place has its data already.
    const bool has_it = lead.collective == ipc::Collective::kBroadcast && rank_of(s) == lead.root &&
                        s.recv == s.send;
    if (!has_it) streams_.copy(s.device, s.recv, buffer_.get(), bytes_);
  }
  signal_ranks(collective_, devices_, streams_);
}

}  // namespace gradsync::daemon
