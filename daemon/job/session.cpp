#include "daemon/job/session.h"

#include <algorithm>
#include <cstring>

namespace gradsync::daemon {

static_assert(static_cast<int>(ipc::Collective::kBarrier) ==
              static_cast<int>(metrics::CollectiveKind::kBarrier));
static_assert(static_cast<int>(ipc::Collective::kAllToAll) ==
              static_cast<int>(metrics::CollectiveKind::kAllToAll));

Session::Session(uint64_t id, ClientIdentity identity, ipc::Mapping segment, uint32_t ring_entries,
                 ipc::UniqueFd doorbell, metrics::Metrics& metrics)
    : id_(id),
      identity_(std::move(identity)),
      segment_(std::move(segment)),
      view_(ipc::SegmentView::over(segment_.data(), ring_entries)),
      submissions_(view_.submissions, ring_entries),
      completions_(view_.completions, ring_entries),
      doorbell_(std::move(doorbell)),
      metrics_(metrics) {}

bool Session::next_submission(ipc::SubmissionEntry& entry) {
  // Never take more work than the completion ring can answer. The client's read index is
  // shared memory another process writes: read it only when the budget runs out.
  if (take_budget_ == 0) {
    const uint64_t room = completions_.free_slots();
    take_budget_ = room > in_flight_ ? room - in_flight_ : 0;
    if (take_budget_ == 0) return false;
  }
  if (!submissions_.try_pop(entry)) return false;
  --take_budget_;
  ++in_flight_;
  ++submitted_;
  return true;
}

void Session::complete(uint64_t request, ipc::Collective collective, gradsync_result status,
                       std::string_view message) {
  if (status != GRADSYNC_OK) {
    metrics_.collective_failed(static_cast<metrics::CollectiveKind>(collective));
  }
  ipc::CompletionEntry& entry = completion_;
  entry.request = request;
  entry.status = static_cast<uint32_t>(status);
  const size_t length = std::min(message.size(), ipc::kMaxErrorMessageBytes);
  if (length > 0) std::memcpy(entry.message, message.data(), length);  // data() may be null
  entry.message_length = static_cast<uint32_t>(length);
  // Cannot fail: in_flight_ never exceeds the ring's free slots (see next_submission), unless
  // the client corrupted its read index, in which case it loses its own completions.
  completions_.try_push(entry, ipc::used_bytes(entry));
  if (in_flight_ > 0) --in_flight_;
  ++completed_;
  wake_owed_ = true;
}

void Session::wake_if_owed() {
  if (!wake_owed_) return;
  wake_owed_ = false;
  // Once a round, not per completion: each of these is a full fence, which waits for the
  // completions' lines to come back from the client's core. The sequence moves before the
  // look at the flag, so a client that raised it sleeps on a changed word or is woken.
  view_.header->completion_sequence.fetch_add(1, std::memory_order_seq_cst);
  // Taking the flag down means one wake per sleep (the client raises it again before it
  // next sleeps).
  if (view_.header->client_waiting.exchange(0, std::memory_order_seq_cst) != 0) {
    ipc::futex_wake_all(&view_.header->completion_sequence);
  }
}

bool Session::remove_buffer(uint32_t id) {
  for (auto* buffers : {&host_buffers_, &device_buffers_}) {
    if (const auto it = buffers->find(id); it != buffers->end()) {
      registered_bytes_ -= it->second;
      buffers->erase(it);
      return true;
    }
  }
  return false;
}

}  // namespace gradsync::daemon
