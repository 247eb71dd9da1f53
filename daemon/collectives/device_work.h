// Collectives among a node's ranks whose memory is on devices: enqueued on the daemon's
// streams (device_streams.h), done when a fence after them is reached. Ranks may be on one
// device or several; with several, each device reduces its share of the elements, reading the
// others' memory through its CUDA IPC mappings (peer access).
#pragma once

#include "daemon/device/device_streams.h"
#include "daemon/job.h"

namespace gradsync::daemon {

// Whether any collective of `unit` is on device memory (its ranks agree: job.cpp checks).
bool on_device(const ReadyUnit& unit);

// Enqueues every device collective of `unit`; host collectives in it (a group may mix them)
// run now, on this thread. Throws DeviceError.
void enqueue_device_work(const ReadyUnit& unit, DeviceStreams& streams);

}  // namespace gradsync::daemon
