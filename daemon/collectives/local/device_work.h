// Collectives among a node's ranks whose memory is on devices: enqueued on the daemon's
// streams (device_streams.h), done when a fence after them is reached. Ranks may be on one
// device or several; with several, each device reduces its share of the elements, reading the
// others' memory through its CUDA IPC mappings (peer access).
#pragma once

#include "daemon/device/device_streams.h"
#include "daemon/job/ready_unit.h"

#include <cstdint>
#include <vector>

namespace gradsync::daemon {

// Whether any collective of `unit` is on device memory (its ranks agree: job.cpp checks).
bool on_device(const ReadyUnit& unit);

// The devices a collective's ranks' memory lies on, each once, in rank order.
std::vector<int> devices_of(const ReadyCollective& collective);
// Whether the writes of `collective`'s stream-ordered ranks are done (their ready events). The
// daemon enqueues nothing on their memory before, so that its streams never wait on a
// client's event: without MPS that costs a switch between the processes' contexts even when
// the event is done (about 0.15 ms on an H200), and if the client dies first it stops the
// stream, and every job's work on that device, for good. True where asking fails: the work's
// own wait (wait_for_ranks) then reports the failure.
bool ranks_written(const ReadyCollective& collective, DeviceStreams& streams);
// For the stream-ordered ranks of `collective`: every stream in `devices` waits for the rank's
// ready event before it touches their memory...
void wait_for_ranks(const ReadyCollective& collective, const std::vector<int>& devices,
                    DeviceStreams& streams);
// ...and each rank's completion event is recorded once everything enqueued on them is done.
void signal_ranks(const ReadyCollective& collective, const std::vector<int>& devices,
                  DeviceStreams& streams);

// Enqueues `op` over the ranks' inputs into the receive buffers of the first `outputs_of` ranks
// (all of them, or local rank 0's alone), each device reducing its share of elements
// [begin, end) (all of them unless given).
void reduce_on_devices(const ReadyCollective& collective, gradsync_op op, size_t outputs_of,
                       DeviceStreams& streams, uint64_t begin = 0, uint64_t end = UINT64_MAX);

// Enqueues every device collective of `unit`; host collectives in it (a group may mix them)
// run now, on this thread. Throws DeviceError.
void enqueue_device_work(const ReadyUnit& unit, DeviceStreams& streams);

}  // namespace gradsync::daemon
