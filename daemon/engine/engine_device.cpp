// The engine's side of device collectives: buffers from the device mapping cache, units
// enqueued on the daemon's streams once their stream-ordered ranks' writes are done (their
// ready events polled), fences polled, completions posted. The engine thread never waits for a
// GPU; ranks see their collective complete once the device work is done.
#include "daemon/collectives/local/device_work.h"
#include "daemon/engine/engine.h"

#include <fmt/format.h>

#include <algorithm>

namespace gradsync::daemon {

RegisteredMemory Engine::registered_memory(Session& session, uint32_t id) {
  if (!session.has_device_buffers() || !session.is_device_buffer(id)) {
    try {
      return host_buffers_.acquire({session.id(), id});
    } catch (const ipc::SystemError& e) {  // evicted, and it would not map again
      RegisteredMemory memory;
      memory.error = e.what();
      return memory;
    }
  }
  RegisteredMemory memory;
  try {
    const std::shared_ptr<const DeviceBuffer> buffer = device_buffers_.acquire({session.id(), id});
    if (!buffer) return memory;
    memory.data = buffer->data;
    memory.bytes = buffer->bytes;
    memory.device = buffer->device;
    memory.mapping = buffer;
  } catch (const DeviceError& e) {  // evicted, and the allocation would not open again
    memory.error = e.what();
  }
  return memory;
}

void Engine::handle(AddEvents& command) {
  if (auto it = sessions_.find(command.session); it != sessions_.end()) {
    it->second->set_events(std::move(command.events));
  }
  command.done.set_value();
}

void Engine::attach_events(const Session& session, Submission& submission) {
  if (submission.device == kHostMemory) {
    submission.error = "a stream-ordered collective needs device memory";
  } else if (!session.events()) {
    submission.error = "a stream-ordered collective before the client registered its events";
  } else if (static_cast<uint64_t>(submission.event_slot) >= event_slots(*session.events())) {
    submission.error =
        fmt::format("event slot {} of {}", submission.event_slot, event_slots(*session.events()));
  } else {
    submission.events = session.events();
  }
}

bool Engine::device_inputs_done(const ReadyUnit& unit) {
  return std::all_of(unit.collectives.begin(), unit.collectives.end(),
                     [&](const ReadyCollective& c) { return ranks_written(c, device_streams_); });
}

void Engine::launch_device_unit(Job& job, ReadyUnit unit) {
  const auto start = Clock::now();
  try {
    enqueue_device_work(unit, device_streams_);
    const DeviceStreams::Fence fence = device_streams_.fence();
    // Every rank completes at the fence, stream-ordered ones too: their completion events are
    // done by then, and the client enqueues no wait for a done event (without MPS a stream's
    // wait on another process's event costs a context switch even then).
    device_in_flight_.push_back(DeviceUnit{job.name(), std::move(unit), fence, start});
  } catch (const DeviceError& e) {
    // Whatever was enqueued before the failure still runs: its fence keeps the buffers mapped
    // until it has.
    log_->error("job '{}': device work failed to start: {}", job.name(), e.what());
    complete(unit, GRADSYNC_ERR_INTERNAL, std::string("device work failed: ") + e.what());
    for (auto& c : unit.collectives) {  // completed: only the mappings are kept
      for (auto& s : c.ranks) s.session = nullptr;
    }
    try {
      const DeviceStreams::Fence fence = device_streams_.fence();
      device_in_flight_.push_back(DeviceUnit{job.name(), std::move(unit), fence, start, true});
    } catch (const DeviceError&) {  // no fence either: the device is lost
    }
  }
}

bool Engine::poll_device_work() {
  bool progressed = false;
  for (auto it = device_in_flight_.begin(); it != device_in_flight_.end();) {
    gradsync_result status = GRADSYNC_OK;
    std::string message;
    try {
      if (!device_streams_.reached(it->fence)) {
        ++it;
        continue;
      }
    } catch (const DeviceError& e) {
      log_->error("job '{}': device work failed: {}", it->job, e.what());
      status = GRADSYNC_ERR_INTERNAL;
      message = std::string("device work failed: ") + e.what();
    }
    const auto end = Clock::now();
    for (const auto& c : it->unit.collectives) {
      for (const auto& s : c.ranks) {
        if (s.session != nullptr) complete(s, status, message);
      }
    }
    if (status == GRADSYNC_OK && !it->failed) {
      if (auto job = jobs_.find(it->job); job != jobs_.end()) {
        const uint64_t collectives = record_local_completion(*job->second, it->unit, end);
        metrics_.batch_executed(it->unit.bytes(), collectives,
                                std::chrono::duration<double>(end - it->start).count(),
                                static_cast<double>(it->unit.bytes()) /
                                    static_cast<double>(config_.fusion_threshold_bytes));
      }
    }
    it = device_in_flight_.erase(it);
    progressed = true;
  }
  return progressed;
}

void Engine::forget_device_work_of(const Session& session) {
  for (DeviceUnit& in_flight : device_in_flight_) {
    for (auto& c : in_flight.unit.collectives) {
      for (auto& s : c.ranks) {
        if (s.session == &session) s.session = nullptr;
      }
    }
  }
}

}  // namespace gradsync::daemon
