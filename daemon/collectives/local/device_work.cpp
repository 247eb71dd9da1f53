#include "daemon/collectives/local/device_work.h"

#include "daemon/collectives/local/local_work.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace gradsync::daemon {
namespace {

// A device reduction reads every local rank's input in one kernel.
void check_operands(const ReadyCollective& collective) {
  if (collective.ranks.size() > DeviceStreams::max_operands()) {
    const Submission& lead = collective.first();
    throw DeviceError(
        fmt::format("tensor '{}': a device {} of {} local ranks; the kernels take "
                    "at most {}",
                    lead.name, ipc::collective_name(lead.collective), collective.ranks.size(),
                    DeviceStreams::max_operands()));
  }
}

void allreduce(const ReadyCollective& collective, DeviceStreams& streams) {
  reduce_on_devices(collective, collective.first().op, collective.ranks.size(), streams);
}

// Each copy runs on the receiving rank's device, reading the source through its mapping.
void broadcast(const ReadyCollective& collective, DeviceStreams& streams) {
  const auto& ranks = collective.ranks;
  const Submission& root = ranks[static_cast<size_t>(collective.first().root)];
  const uint64_t bytes = root.block_bytes();
  for (const Submission& rank : ranks) {
    if (rank.recv != root.send) streams.copy(rank.device, rank.recv, root.send, bytes);
  }
}

void allgather(const ReadyCollective& collective, DeviceStreams& streams) {
  const auto& ranks = collective.ranks;
  const uint64_t bytes = collective.first().block_bytes();
  for (size_t slot = 0; slot < ranks.size(); ++slot) {
    for (const Submission& rank : ranks) {
      uint8_t* target = rank.recv + slot * bytes;
      if (target != ranks[slot].send) streams.copy(rank.device, target, ranks[slot].send, bytes);
    }
  }
}

// Block j is reduced on rank j's device, which reads the other ranks' blocks through their
// mappings and writes only its own rank's result.
void reduce_scatter(const ReadyCollective& collective, DeviceStreams& streams) {
  const auto& ranks = collective.ranks;
  const Submission& lead = collective.first();
  check_operands(collective);
  const uint64_t bytes = lead.block_bytes();
  std::vector<const void*> inputs(ranks.size());
  for (size_t block = 0; block < ranks.size(); ++block) {
    for (size_t r = 0; r < ranks.size(); ++r) inputs[r] = ranks[r].send + block * bytes;
    void* output = ranks[block].recv;
    streams.reduce(ranks[block].device, lead.dtype, lead.op, inputs.data(), inputs.size(), &output,
                   1, lead.count);
  }
}

// Each block is copied on its receiving rank's device, reading the sender's through its mapping.
void alltoall(const ReadyCollective& collective, DeviceStreams& streams) {
  const auto& ranks = collective.ranks;
  const uint64_t bytes = collective.first().block_bytes();
  for (size_t target = 0; target < ranks.size(); ++target) {
    for (size_t source = 0; source < ranks.size(); ++source) {
      streams.copy(ranks[target].device, ranks[target].recv + source * bytes,
                   ranks[source].send + target * bytes, bytes);
    }
  }
}

}  // namespace

void reduce_on_devices(const ReadyCollective& collective, gradsync_op op, size_t outputs_of,
                       DeviceStreams& streams, uint64_t begin, uint64_t end) {
  const auto& ranks = collective.ranks;
  const Submission& lead = collective.first();
  check_operands(collective);
  const size_t element = ipc::dtype_bytes(lead.dtype);
  end = std::min(end, lead.count);
  begin = std::min(begin, end);
  const std::vector<int> devices = devices_of(collective);
  // Each device's share, cut at 16-byte bounds so that every share keeps the kernel's packs.
  const uint64_t pack = std::max<uint64_t>(16 / element, 1);
  const uint64_t share = ((end - begin) / devices.size() + pack - 1) / pack * pack;
  std::vector<const void*> inputs(ranks.size());
  std::vector<void*> outputs(std::min(outputs_of, ranks.size()));
  for (size_t d = 0; d < devices.size(); ++d) {
    const uint64_t from = std::min(end, begin + d * share);
    const uint64_t to = d + 1 == devices.size() ? end : std::min(end, from + share);
    if (from == to) continue;
    for (size_t r = 0; r < ranks.size(); ++r) inputs[r] = ranks[r].send + from * element;
    for (size_t r = 0; r < outputs.size(); ++r) outputs[r] = ranks[r].recv + from * element;
    streams.reduce(devices[d], lead.dtype, op, inputs.data(), inputs.size(), outputs.data(),
                   outputs.size(), to - from);
  }
}

std::vector<int> devices_of(const ReadyCollective& collective) {
  std::vector<int> devices;
  for (const Submission& s : collective.ranks) {
    if (std::find(devices.begin(), devices.end(), s.device) == devices.end()) {
      devices.push_back(s.device);
    }
  }
  return devices;
}

bool ranks_written(const ReadyCollective& collective, DeviceStreams& streams) {
  for (const Submission& s : collective.ranks) {
    if (s.event_slot < 0 || !s.events) continue;
    try {
      if (!streams.ready_done(*s.events, static_cast<uint32_t>(s.event_slot))) return false;
    } catch (const DeviceError&) {  // reported by the wait that follows
    }
  }
  return true;
}

void wait_for_ranks(const ReadyCollective& collective, const std::vector<int>& devices,
                    DeviceStreams& streams) {
  for (const Submission& s : collective.ranks) {
    if (s.event_slot < 0) continue;
    for (const int device : devices) {
      streams.wait_ready(device, *s.events, static_cast<uint32_t>(s.event_slot));
    }
  }
}

void signal_ranks(const ReadyCollective& collective, const std::vector<int>& devices,
                  DeviceStreams& streams) {
  for (const Submission& s : collective.ranks) {
    if (s.event_slot < 0) continue;
    streams.join(events_device(*s.events), devices);
    streams.record_completion(*s.events, static_cast<uint32_t>(s.event_slot));
  }
}

bool on_device(const ReadyUnit& unit) {
  return std::any_of(unit.collectives.begin(), unit.collectives.end(),
                     [](const ReadyCollective& c) { return c.first().device != kHostMemory; });
}

void enqueue_device_work(const ReadyUnit& unit, DeviceStreams& streams) {
  for (const ReadyCollective& collective : unit.collectives) {
    if (collective.first().device == kHostMemory) {
      const LocalWork work = local_work_for(collective);
      if (work.run) work.run(0, work.elements);
      continue;
    }
    // Stream-ordered ranks: nothing touches the memory before their writes are done, and their
    // streams go on once every device's part is.
    const std::vector<int> devices = devices_of(collective);
    wait_for_ranks(collective, devices, streams);
    switch (collective.first().collective) {
      case ipc::Collective::kAllreduce:
        allreduce(collective, streams);
        break;
      case ipc::Collective::kBroadcast:
        broadcast(collective, streams);
        break;
      case ipc::Collective::kAllgather:
        allgather(collective, streams);
        break;
      case ipc::Collective::kReduceScatter:
        reduce_scatter(collective, streams);
        break;
      case ipc::Collective::kAllToAll:
        alltoall(collective, streams);
        break;
      case ipc::Collective::kBarrier:
        break;
    }
    signal_ranks(collective, devices, streams);
  }
}

}  // namespace gradsync::daemon
