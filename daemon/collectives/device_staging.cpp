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

DeviceStage::DeviceStage(const std::vector<const ReadyCollective*>& collectives,
                         DeviceStreams& streams, int32_t world_size)
    : streams_(streams) {
  members_.reserve(collectives.size());
  uint64_t total = 0;
  for (const ReadyCollective* collective : collectives) {
    const Submission& lead = collective->first();
    const uint64_t block = lead.send_bytes();
    const uint64_t bytes = lead.collective == ipc::Collective::kAllgather
                               ? block * static_cast<uint64_t>(world_size)
                               : block;
    members_.push_back({collective, total, bytes, devices_of(*collective), {}});
    total += bytes;
  }
  buffer_ = streams.pinned(total);
  const std::shared_ptr<const void> keep = buffer_;
  for (Member& member : members_) {
    const ReadyCollective& collective = *member.collective;
    const Submission& lead = collective.first();
    uint8_t* at = buffer_.get() + member.offset;
    member.host.times = collective.times;
    member.host.ranks.reserve(collective.ranks.size());
    for (const Submission& s : collective.ranks) {
      Submission& staged = member.host.ranks.emplace_back(s);
      staged.device = kHostMemory;
      staged.event_slot = -1;
      staged.events.reset();
      staged.send_buffer = keep;
      staged.recv_buffer = keep;
      staged.recv = at;
      // An allgather's ranks each own a slot of the buffer; the others' collectives share it
      // whole (a broadcast's root's data, an allreduce's node-wide sum).
      staged.send = lead.collective == ipc::Collective::kAllgather
                        ? at + static_cast<uint64_t>(rank_of(s)) * lead.send_bytes()
                        : at;
      // An allreduce's ranks were reduced on the devices: one contributes for all.
      if (lead.collective == ipc::Collective::kAllreduce) break;
    }
  }
}

DeviceStage::~DeviceStage() {
  if (!last_fence_) return;
  try {
    if (streams_.reached(*last_fence_)) return;
    std::vector<std::shared_ptr<const void>> memory{buffer_};
    for (const Member& member : members_) member.collective->append_memory(memory);
    streams_.release_after(*last_fence_, std::move(memory));
  } catch (const DeviceError&) {  // the work failed: it touches nothing any more
  }
}

std::vector<const ReadyCollective*> DeviceStage::hosts() const {
  std::vector<const ReadyCollective*> hosts;
  hosts.reserve(members_.size());
  for (const Member& member : members_) hosts.push_back(&member.host);
  return hosts;
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
  return transfer([this] {
    for (const Member& member : members_) stage_in(member);
  });
}

NodeAwait<FenceWait> DeviceStage::to_devices() {
  return transfer([this] {
    for (const Member& member : members_) stage_out(member);
  });
}

void DeviceStage::stage_in(const Member& member) {
  const ReadyCollective& collective = *member.collective;
  wait_for_ranks(collective, member.devices, streams_);
  const Submission& lead = collective.first();
  uint8_t* at = buffer_.get() + member.offset;
  switch (lead.collective) {
    case ipc::Collective::kAllreduce:
      if (collective.ranks.size() == 1) {
        streams_.copy(lead.device, at, lead.send, member.bytes);
        return;
      }
      // Summed, not averaged, on the node: the algorithm across nodes divides once at its end.
      reduce_on_devices(collective, node_detail::network_op(lead.op), 1, streams_);
      streams_.join(lead.device, member.devices);
      streams_.copy(lead.device, at, lead.recv, member.bytes);
      return;
    case ipc::Collective::kBroadcast:
      for (const Submission& s : collective.ranks) {
        if (rank_of(s) == lead.root) streams_.copy(s.device, at, s.send, member.bytes);
      }
      return;
    case ipc::Collective::kAllgather:
      for (const Submission& s : collective.ranks) {
        const uint64_t block = s.send_bytes();
        streams_.copy(s.device, at + static_cast<uint64_t>(rank_of(s)) * block, s.send, block);
      }
      return;
    case ipc::Collective::kBarrier:
      return;
  }
}

void DeviceStage::stage_out(const Member& member) {
  const ReadyCollective& collective = *member.collective;
  const Submission& lead = collective.first();
  for (const Submission& s : collective.ranks) {
    // A broadcast's root in place has its data already.
    const bool has_it = lead.collective == ipc::Collective::kBroadcast && rank_of(s) == lead.root &&
                        s.recv == s.send;
    if (!has_it) streams_.copy(s.device, s.recv, buffer_.get() + member.offset, member.bytes);
  }
  signal_ranks(collective, member.devices, streams_);
}

}  // namespace gradsync::daemon
