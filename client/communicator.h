// libgradsync's communicator: the control connection, the rings, the registered buffers and
// the requests in flight. The C ABI (gradsync.cpp) is a thin shim over this class.
#pragma once

#include "client/cuda_driver.h"
#include "client/request_table.h"
#include "client/shared_heap.h"
#include "ipc/frame_socket.h"
#include "ipc/messages.h"
#include "ipc/protocol.h"
#include "ipc/segment.h"

#include <gradsync/gradsync.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace gradsync::client {

// A failed call: the result code and the message gradsync_last_error() returns.
class Error : public std::runtime_error {
 public:
  Error(gradsync_result code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  gradsync_result code() const { return code_; }

 private:
  gradsync_result code_;
};

struct CollectiveArgs {
  ipc::Collective collective;
  const char* name;  // nullptr: generated from the collective's sequence number
  const void* send;
  void* recv;
  size_t count;
  gradsync_dtype dtype;
  gradsync_op op;
  int32_t root;
};

class Communicator {
 public:
  Communicator(const gradsync_options& options, const gradsync_job_settings& settings);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  void* allocate(size_t bytes);
  void free(void* ptr);
  void register_range(void* ptr, size_t bytes);
  // Device memory the daemon opens through CUDA IPC or, for VMM memory, the segments' fds;
  // `ptr` is this process's address of it. The allocation ids in `memory` are checked at each
  // submission (none: the caller's own handle, not checked).
  void register_device(void* ptr, size_t bytes, DeviceMemory memory);
  void unregister(void* ptr);
  // Collectives may use memory of `heap` without registering it: the communicator registers
  // each of its arenas whole on first use, and unregisters it once the heap lets it go.
  void attach_heap(std::shared_ptr<SharedHeap> heap);
  // Collectives on device memory are ordered on `stream` from now on (nullptr: the legacy
  // default stream), or, after unset_stream, host-synchronous again.
  void set_stream(void* stream);
  void unset_stream();
  // Collectives submitted from now on carry `priority` (gradsync_set_priority).
  void set_priority(int32_t priority) { priority_ = priority; }

  gradsync_request submit(const CollectiveArgs& args);
  void group_start();
  void group_end();

  // Outcome of a request; the message (for errors) goes to *message.
  gradsync_result wait(gradsync_request request, std::string* message);
  // As wait, until `deadline` at most: GRADSYNC_IN_PROGRESS then, the request still in flight.
  gradsync_result wait_until_deadline(gradsync_request request,
                                      std::chrono::steady_clock::time_point deadline,
                                      std::string* message);
  gradsync_result test(gradsync_request request, std::string* message);

  const gradsync_options& options() const { return options_; }

 private:
  struct Registered {
    uint8_t* base;
    size_t bytes;
    uint32_t id;
    bool device = false;
    // Device memory: the driver's buffer ids when registered (DeviceMemory::allocation_ids).
    std::vector<std::pair<const uint8_t*, uint64_t>> allocation_ids;
    // An attached heap's arena, registered whole: held so its address range is not reused.
    std::shared_ptr<const SharedHeap::Arena> arena;
  };
  struct AttachedHeap {
    std::shared_ptr<SharedHeap> heap;
    uint64_t releases_seen = 0;  // SharedHeap::releases at the last look
  };
  // A stream-ordered request in flight: its event slot and the stream to order it on.
  struct Ordered {
    uint32_t slot;
    void* stream;
  };
  ipc::DecodedMessage round_trip(capnp::MessageBuilder& request, std::span<const int> fds = {});
  void push(const ipc::SubmissionEntry& entry);
  void drain_completions();
  // Waits (spin, yield, then futex) until `done` holds, or until `deadline` where one is given
  // (false then); throws if the daemon goes away.
  template <typename Predicate>
  bool wait_until(Predicate done,
                  std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
  void check_daemon_alive();
  void check_not_registered(const void* ptr, size_t bytes) const;
  // Registers [ptr, ptr + bytes), which lies inside `arena`, as host memory.
  void register_in_arena(void* ptr, size_t bytes, const SharedHeap::Arena& arena);
  // Registers [ptr, ptr + bytes) under a fresh id, `offset` into its memory, sending `fds` with
  // it; `set_memory` fills in which kind of memory it is.
  template <typename SetMemory>
  void send_registration(void* ptr, size_t bytes, uint64_t offset, std::span<const int> fds,
                         bool device,
                         std::vector<std::pair<const uint8_t*, uint64_t>> allocation_ids,
                         SetMemory set_memory);
  // Registers this process's events with the daemon on first use; a free slot, waiting for
  // completions if none is free.
  uint32_t acquire_event_slot();
  // A completion of a stream-ordered request: its stream waits on the daemon's event.
  void order_completion(uint64_t request, gradsync_result& status, std::string& message);
  // The registration [ptr, ptr + bytes) lies inside: an attached heap's arena is registered
  // here on first use. Throws naming `what` where there is none.
  const Registered& usable_range(const void* ptr, uint64_t bytes, const char* what);
  const Registered* registered_range(const void* ptr, uint64_t bytes) const;
  // Unregisters the arenas attached heaps have let go of since the last look.
  void forget_released_arenas();
  gradsync_result take(gradsync_request request, std::string* message);

  gradsync_options options_;
  ipc::UniqueFd socket_;
  ipc::FrameReader reader_;
  ipc::Mapping segment_;
  ipc::SegmentView view_;
  ipc::RingProducer<ipc::SubmissionEntry> submissions_;
  ipc::RingConsumer<ipc::CompletionEntry> completions_;
  // Where a completion is read into: zeroed once, not at every look (a wait looks at least once).
  ipc::CompletionEntry completion_{};
  ipc::UniqueFd doorbell_;
  std::chrono::microseconds spin_{0};  // before a waiter sleeps (wait_policy.h)
  uint32_t in_flight_ = 0;
  uint64_t next_request_ = 1;
  uint64_t unnamed_sequence_ = 0;
  uint32_t next_buffer_id_ = 1;
  std::map<uintptr_t, Registered> registered_;  // by base address
  RequestTable requests_;
  int32_t priority_ = 0;
  bool stream_ordered_ = false;
  void* stream_ = nullptr;
  std::unique_ptr<StreamEvents> events_;
  std::unordered_map<uint64_t, Ordered> ordered_;  // by request
  bool grouping_ = false;
  uint64_t next_group_ = 1;
  std::vector<ipc::SubmissionEntry> group_;
  bool daemon_gone_ = false;
  std::chrono::steady_clock::time_point last_liveness_check_{};
  std::string daemon_gone_reason_;
  std::vector<AttachedHeap> attached_heaps_;
  SharedHeap heap_;  // last: buffers outlive nothing that points into them
};

}  // namespace gradsync::client
