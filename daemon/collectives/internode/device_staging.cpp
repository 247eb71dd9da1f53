#include "daemon/collectives/internode/device_staging.h"

#include "daemon/collectives/internode/node_collectives.h"
#include "daemon/collectives/local/device_work.h"

#include <algorithm>
#include <utility>

namespace gradsync::daemon {
namespace {

int32_t rank_of(const Submission& s) {
  return s.session->identity().rank;
}

}  // namespace

StagingPieces staging_pieces(const ReadyCollective& collective) {
  const Submission& lead = collective.first();
  StagingPieces pieces{1, lead.count};
  if (lead.device == kHostMemory || lead.collective != ipc::Collective::kAllreduce ||
      lead.count == 0) {
    return pieces;
  }
  const uint64_t element = ipc::dtype_bytes(lead.dtype);
  pieces.count = std::clamp<uint64_t>(
      (lead.count * element + kStagingPieceBytes - 1) / kStagingPieceBytes, 1, kMaxStagingPieces);
  // Whole 16-byte packs in every piece but the last: the device kernels' vectors stay aligned.
  const uint64_t pack = std::max<uint64_t>(16 / element, 1);
  pieces.elements = ((lead.count + pieces.count - 1) / pieces.count + pack - 1) / pack * pack;
  pieces.count = std::max<uint64_t>(1, (lead.count + pieces.elements - 1) / pieces.elements);
  return pieces;
}

bool FenceWait::ready() {
  if (streams_ == nullptr) return true;
  try {
    return streams_->reached(fence_);
  } catch (const DeviceError& e) {
    error_ = std::string("device work failed: ") + e.what();
    return true;
  }
}

bool WrittenWait::ready() {
  while (written_ < collectives_.size() &&
         daemon::ranks_written(*collectives_[written_], *streams_)) {
    ++written_;
  }
  return written_ == collectives_.size();
}

NodeAwait<WrittenWait> DeviceStage::ranks_written() const {
  std::vector<const ReadyCollective*> collectives;
  collectives.reserve(members_.size());
  for (const Member& member : members_) collectives.push_back(member.collective);
  return {WrittenWait(streams_, std::move(collectives))};
}

DeviceStage::DeviceStage(const std::vector<const ReadyCollective*>& collectives,
                         DeviceStreams& streams, int32_t world_size)
    : streams_(streams), world_size_(world_size) {
  members_.reserve(collectives.size());
  uint64_t total = 0;
  for (const ReadyCollective* collective : collectives) {
    const Submission& lead = collective->first();
    // One receive range (shared, or an allgather's whole result), or where ranks send a block
    // to each rank, every rank's two ranges, sends first.
    const uint64_t bytes =
        ipc::sends_a_block_per_rank(lead.collective)
            ? (lead.send_bytes(world_size) + lead.recv_bytes(world_size)) * collective->ranks.size()
            : lead.recv_bytes(world_size);
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
      // An allgather's ranks each own a slot of the buffer, a reduce-scatter's and an
      // all-to-all's their own ranges; the others' collectives share it whole (a broadcast's
      // root's data, an allreduce's node-wide sum).
      staged.send = lead.collective == ipc::Collective::kAllgather
                        ? at + static_cast<uint64_t>(rank_of(s)) * lead.block_bytes()
                        : at;
      if (ipc::sends_a_block_per_rank(lead.collective)) {
        const uint64_t index = member.host.ranks.size() - 1;
        const uint64_t sends = lead.send_bytes(world_size) * collective.ranks.size();
        staged.send = at + index * lead.send_bytes(world_size);
        staged.recv = at + sends + index * lead.recv_bytes(world_size);
      }
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
    for (const Member& member : members_) {
      stage_in(member, 0, member.collective->first().count);
    }
  });
}

NodeAwait<FenceWait> DeviceStage::to_devices() {
  return transfer([this] {
    for (const Member& member : members_) {
      stage_out(member, 0, member.collective->first().count);
    }
  });
}

NodeAwait<FenceWait> DeviceStage::to_host(uint64_t begin, uint64_t end) {
  return transfer([this, begin, end] { stage_in(members_.front(), begin, end); });
}

NodeAwait<FenceWait> DeviceStage::to_devices(uint64_t begin, uint64_t end) {
  return transfer([this, begin, end] { stage_out(members_.front(), begin, end); });
}

ReadyCollective DeviceStage::piece(uint64_t begin, uint64_t end) const {
  ReadyCollective piece = members_.front().host;
  Submission& staged = piece.ranks.front();
  const uint64_t element = ipc::dtype_bytes(staged.dtype);
  staged.send += begin * element;
  staged.recv += begin * element;
  staged.count = end - begin;
  return piece;
}

void DeviceStage::stage_in(const Member& member, uint64_t begin, uint64_t end) {
  const ReadyCollective& collective = *member.collective;
  const Submission& lead = collective.first();
  if (begin == 0) wait_for_ranks(collective, member.devices, streams_);
  uint8_t* at = buffer_.get() + member.offset;
  switch (lead.collective) {
    case ipc::Collective::kAllreduce: {
      const uint64_t element = ipc::dtype_bytes(lead.dtype);
      const uint64_t skip = begin * element;
      const uint64_t bytes = (end - begin) * element;
      if (collective.ranks.size() == 1) {
        streams_.copy(lead.device, at + skip, lead.send + skip, bytes);
        return;
      }
      // Summed, not averaged, on the node: the algorithm across nodes divides once at its end.
      reduce_on_devices(collective, node_detail::network_op(lead.op), 1, streams_, begin, end);
      streams_.join(lead.device, member.devices);
      streams_.copy(lead.device, at + skip, lead.recv + skip, bytes);
      return;
    }
    case ipc::Collective::kBroadcast:
      for (const Submission& s : collective.ranks) {
        if (rank_of(s) == lead.root) streams_.copy(s.device, at, s.send, member.bytes);
      }
      return;
    case ipc::Collective::kAllgather:
      for (const Submission& s : collective.ranks) {
        const uint64_t block = s.block_bytes();
        streams_.copy(s.device, at + static_cast<uint64_t>(rank_of(s)) * block, s.send, block);
      }
      return;
    case ipc::Collective::kReduceScatter:
    case ipc::Collective::kAllToAll:
      for (size_t r = 0; r < collective.ranks.size(); ++r) {
        const Submission& s = collective.ranks[r];
        const uint64_t range = s.send_bytes(world_size_);
        streams_.copy(s.device, at + r * range, s.send, range);
      }
      return;
    case ipc::Collective::kBarrier:
      return;
  }
}

void DeviceStage::stage_out(const Member& member, uint64_t begin, uint64_t end) {
  const ReadyCollective& collective = *member.collective;
  const Submission& lead = collective.first();
  uint64_t skip = 0;
  uint64_t bytes = member.bytes;
  if (lead.collective == ipc::Collective::kAllreduce) {
    const uint64_t element = ipc::dtype_bytes(lead.dtype);
    skip = begin * element;
    bytes = (end - begin) * element;
  }
  if (ipc::sends_a_block_per_rank(lead.collective)) {
    for (size_t r = 0; r < collective.ranks.size(); ++r) {
      const Submission& s = collective.ranks[r];
      streams_.copy(s.device, s.recv, member.host.ranks[r].recv, s.recv_bytes(world_size_));
    }
    signal_ranks(collective, member.devices, streams_);
    return;
  }
  for (const Submission& s : collective.ranks) {
    // A broadcast's root in place has its data already.
    const bool has_it = lead.collective == ipc::Collective::kBroadcast && rank_of(s) == lead.root &&
                        s.recv == s.send;
    if (!has_it)
      streams_.copy(s.device, s.recv + skip, buffer_.get() + member.offset + skip, bytes);
  }
  if (end == lead.count) signal_ranks(collective, member.devices, streams_);
}

}  // namespace gradsync::daemon
