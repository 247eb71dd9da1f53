// RAII over the parts of UCX (UCP) gradsync uses: context, worker, listener, endpoints and
// requests. Every call's status is checked; failures throw UcxError naming the call, the UCX
// status and where it was made.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gradsync::transport {

class UcxError : public std::runtime_error {
 public:
  UcxError(const std::string& call, ucs_status_t status, const char* file, int line);
  ucs_status_t status() const { return status_; }

 private:
  ucs_status_t status_;
};

#define GRADSYNC_UCX_CHECK(call)                                                              \
  do {                                                                                        \
    const ucs_status_t gradsync_ucx_status_ = (call);                                         \
    if (gradsync_ucx_status_ != UCS_OK) {                                                     \
      throw ::gradsync::transport::UcxError(#call, gradsync_ucx_status_, __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)

struct ContextDeleter {
  void operator()(ucp_context_h context) const { ucp_cleanup(context); }
};
struct WorkerDeleter {
  void operator()(ucp_worker_h worker) const { ucp_worker_destroy(worker); }
};
struct ListenerDeleter {
  void operator()(ucp_listener_h listener) const { ucp_listener_destroy(listener); }
};
using Context = std::unique_ptr<std::remove_pointer_t<ucp_context_h>, ContextDeleter>;
using Worker = std::unique_ptr<std::remove_pointer_t<ucp_worker_h>, WorkerDeleter>;
using Listener = std::unique_ptr<std::remove_pointer_t<ucp_listener_h>, ListenerDeleter>;

// Tag matching, active messages (the cluster handshake) and wake-ups; one worker per engine
// thread (UCS_THREAD_MODE_SINGLE).
// `settings` override UCX configuration keys (names without the UCX_ prefix) over what the
// environment says.
Context create_context(const std::vector<std::pair<std::string, std::string>>& settings = {});
Worker create_worker(ucp_context_h context);

// Sends the transport holds: started, not finished; the bytes of those delivered; and for how
// long it held at least `backlog_bytes`, more than the network would take at once: the rate at
// which sends are delivered then is what the link carries, whatever the jobs would send (the
// pacer's link figure).
class HeldSends {
 public:
  using Clock = std::chrono::steady_clock;
  explicit HeldSends(uint64_t backlog_bytes) : backlog_bytes_(backlog_bytes) {}

  void add(uint64_t bytes) {
    ++count_;
    set_bytes(bytes_ + bytes);
  }
  // A held send ends: delivered, or failed or given up on (which carried nothing we know of).
  void remove(uint64_t bytes, bool delivered) {
    --count_;
    set_bytes(bytes_ - bytes);
    if (delivered) delivered_bytes_ += bytes;
  }
  // A send the transport finished as it started, never held.
  void delivered_at_once(uint64_t bytes) { delivered_bytes_ += bytes; }
  size_t count() const { return count_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t delivered_bytes() const { return delivered_bytes_; }
  // Time held at or above the backlog, up to `now`.
  Clock::duration backlogged(Clock::time_point now) const {
    return backlogged_ + (bytes_ >= backlog_bytes_ ? now - backlogged_since_ : Clock::duration{});
  }

 private:
  void set_bytes(uint64_t bytes) {
    const bool was = bytes_ >= backlog_bytes_;
    const bool is = bytes >= backlog_bytes_;
    bytes_ = bytes;
    if (was == is) return;
    const auto now = Clock::now();
    if (is) {
      backlogged_since_ = now;
    } else {
      backlogged_ += now - backlogged_since_;
    }
  }

  uint64_t backlog_bytes_;
  size_t count_ = 0;
  uint64_t bytes_ = 0;
  uint64_t delivered_bytes_ = 0;
  Clock::duration backlogged_{};
  Clock::time_point backlogged_since_{};
};

// One send or receive in flight: one message, or a run of messages with the same tag between
// the same two endpoints, which UCX's tag matching delivers in order (a large buffer sent as
// several eager messages, Mesh::send). Move-only. Destroying it while pending cancels a
// receive's requests and releases them all: UCX never calls back into them again, though a
// receive already matched may still be writing its buffer, so a buffer must outlive the
// worker's progress, not only the Operation. A pending Operation must not outlive its worker;
// a completed one may.
class Operation {
 public:
  Operation() = default;
  Operation(Operation&& other) noexcept
      : worker_(std::exchange(other.worker_, nullptr)),
        receive_(other.receive_),
        state_(std::move(other.state_)) {}
  Operation& operator=(Operation&& other) noexcept;
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;
  ~Operation() { release(); }

  bool valid() const { return state_ != nullptr; }
  bool done() const { return state_->done; }
  ucs_status_t status() const { return state_->status; }
  size_t received_bytes() const { return state_->received; }
  uint64_t sender_tag() const { return state_->sender_tag; }  // of a completed receive
  bool is_receive() const { return receive_; }
  // A receive's requests not matched yet complete now, cancelled (UCX will not write their
  // buffers); those already matched finish on their own. Does nothing to a send.
  void cancel();

  static constexpr uint32_t kAnySource = UINT32_MAX;
  struct State;
  // One UCX request of the operation; its callback clears `request` as it frees it.
  struct Part {
    State* state = nullptr;
    void* request = nullptr;  // pending while not null
  };
  // The state UCX's callbacks write; public for the callbacks in ucx.cpp.
  struct State {
    bool done = false;
    ucs_status_t status = UCS_OK;  // the first error of any part
    size_t received = 0;           // by every part of a receive
    uint64_t sender_tag = 0;
    // A send UCX has not finished counts here, with its bytes, until it finishes or is
    // released (Mesh): set before start(), cleared once the send no longer counts.
    HeldSends* held = nullptr;
    size_t send_bytes = 0;
    void stop_holding(bool delivered) {
      if (held == nullptr) return;
      held->remove(send_bytes, delivered);
      held = nullptr;
    }
    // For a receive: the peer (the mesh's id) whose data it waits for, or any peer.
    uint32_t source = kAnySource;
    // The parts: most operations have one, kept here without an allocation; the others
    // reserve theirs up front and never grow, since UCX holds pointers to them.
    Part first;
    std::vector<Part> more;
    size_t started = 0;  // parts started
    size_t pending = 0;  // parts UCX has not finished
    Part& part(size_t index) { return index == 0 ? first : more[index - 1]; }
  };
  uint32_t source() const { return state_->source; }
  const State* state() const { return state_.get(); }

  // An operation with no UCX request, whose transport completes it by writing its State
  // (done, status, received, sender_tag) itself: the in-process transport's. The State stays
  // where it is while the Operation moves, so the transport may keep a pointer to it.
  static Operation without_requests(std::unique_ptr<State> state, bool receive) {
    return Operation(nullptr, std::move(state), receive, 0);
  }

  // Starts an operation of `parts` UCX requests (a send or a receive, as `receive` says):
  // `issue(part, params)` starts each, with `params` set for its callback (add to them, keep
  // what is there), and returns what UCX returned. An error stops the rest.
  template <typename Issue>
  static Operation start(ucp_worker_h worker, std::unique_ptr<State> state, bool receive,
                         size_t parts, Issue&& issue) {
    Operation operation(worker, std::move(state), receive, parts);
    for (size_t part = 0; part < parts && operation.state_->status == UCS_OK; ++part) {
      ucp_request_param_t params = operation.add_part();
      operation.part_started(issue(part, params));
    }
    operation.all_started();
    return operation;
  }

 private:
  Operation(ucp_worker_h worker, std::unique_ptr<State> state, bool receive, size_t parts);
  ucp_request_param_t add_part();  // the parameters of the next part's request
  void part_started(ucs_status_ptr_t request);
  void all_started();
  void release();
  ucp_worker_h worker_ = nullptr;
  bool receive_ = false;  // only receives can be cancelled
  std::unique_ptr<State> state_;
};

}  // namespace gradsync::transport
