// A thin C++ RAII wrapper over the C ABI of gradsync.h. Header-only: it adds no symbols to
// libgradsync and no ABI of its own.
#pragma once

#include <gradsync/gradsync.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace gradsync {

class Error : public std::runtime_error {
 public:
  Error(gradsync_result code, const std::string& message)
      : std::runtime_error(std::string(gradsync_result_string(code)) + ": " + message),
        code_(code) {}
  gradsync_result code() const { return code_; }

 private:
  gradsync_result code_;
};

inline void check(gradsync_result result, const gradsync_comm* comm) {
  if (result != GRADSYNC_OK) throw Error(result, gradsync_last_error(comm));
}

class Communicator;

// Host memory from gradsync_alloc, registered with the daemon for as long as this object lives.
class SharedBuffer {
 public:
  SharedBuffer() = default;
  SharedBuffer(SharedBuffer&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  SharedBuffer& operator=(SharedBuffer&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  ~SharedBuffer() { release(); }

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  friend class Communicator;
  SharedBuffer(gradsync_comm* comm, size_t bytes) : comm_(comm), bytes_(bytes) {
    check(gradsync_alloc(comm, bytes, &data_), comm);
    const gradsync_result registered = gradsync_register(comm, data_, bytes);
    if (registered != GRADSYNC_OK) {
      const Error error(registered, gradsync_last_error(comm));
      gradsync_free(comm, data_);
      throw error;
    }
  }
  void release() {
    if (data_ != nullptr) gradsync_free(comm_, data_);  // unregisters too
    data_ = nullptr;
  }

  gradsync_comm* comm_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Device memory (CUDA) registered with the daemon for as long as this object lives.
class DeviceRegistration {
 public:
  DeviceRegistration(gradsync_comm* comm, void* ptr, size_t bytes) : comm_(comm), ptr_(ptr) {
    check(gradsync_register_device(comm, ptr, bytes), comm);
  }
  DeviceRegistration(DeviceRegistration&& other) noexcept
      : comm_(other.comm_), ptr_(std::exchange(other.ptr_, nullptr)) {}
  DeviceRegistration(const DeviceRegistration&) = delete;
  DeviceRegistration& operator=(const DeviceRegistration&) = delete;
  DeviceRegistration& operator=(DeviceRegistration&&) = delete;
  ~DeviceRegistration() {
    if (ptr_ != nullptr) gradsync_unregister(comm_, ptr_);
  }

 private:
  gradsync_comm* comm_ = nullptr;
  void* ptr_ = nullptr;
};

// A heap of shared host memory of the process (gradsync_heap_create): thread-safe, usable by
// every communicator it is attached to without registering.
class Heap {
 public:
  Heap() { check(gradsync_heap_create(&heap_), nullptr); }
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;
  ~Heap() { gradsync_heap_destroy(heap_); }

  gradsync_heap* get() const { return heap_; }
  void* allocate(size_t bytes) {
    void* ptr = nullptr;
    check(gradsync_heap_alloc(heap_, bytes, &ptr), nullptr);
    return ptr;
  }
  void free(void* ptr) { check(gradsync_heap_free(heap_, ptr), nullptr); }

 private:
  gradsync_heap* heap_ = nullptr;
};

class Communicator {
 public:
  // Connects with the identity from the environment (GRADSYNC_SOCKET, GRADSYNC_JOB, RANK, ...).
  Communicator() { check(gradsync_connect(nullptr, &comm_), nullptr); }
  explicit Communicator(const gradsync_options& options) {
    check(gradsync_connect(&options, &comm_), nullptr);
  }
  // With these job settings, whatever the environment says.
  Communicator(const gradsync_options& options, const gradsync_job_settings& settings) {
    check(gradsync_connect_with(&options, &settings, &comm_), nullptr);
  }
  Communicator(Communicator&& other) noexcept : comm_(std::exchange(other.comm_, nullptr)) {}
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator& operator=(Communicator&&) = delete;
  ~Communicator() { gradsync_disconnect(comm_); }

  gradsync_comm* get() const { return comm_; }

  SharedBuffer allocate(size_t bytes) { return SharedBuffer(comm_, bytes); }
  // Collectives may use `heap`'s memory from now on, without registering it.
  void attach(const Heap& heap) { check(gradsync_attach_heap(comm_, heap.get()), comm_); }
  DeviceRegistration register_device(void* ptr, size_t bytes) {
    return DeviceRegistration(comm_, ptr, bytes);
  }
  // Device collectives ordered on `stream` (a cudaStream_t), or host-synchronous again.
  void set_cuda_stream(void* stream) { check(gradsync_set_cuda_stream(comm_, stream), comm_); }
  void unset_cuda_stream() { check(gradsync_unset_cuda_stream(comm_), comm_); }
  // The priority of the collectives submitted from now on (API version 7).
  void set_priority(int32_t priority) { check(gradsync_set_priority(comm_, priority), comm_); }

  gradsync_request allreduce(const char* name, const void* send, void* recv, size_t count,
                             gradsync_dtype dtype, gradsync_op op) {
    gradsync_request request = 0;
    check(gradsync_allreduce(comm_, name, send, recv, count, dtype, op, &request), comm_);
    return request;
  }
  gradsync_request broadcast(const char* name, const void* send, void* recv, size_t count,
                             gradsync_dtype dtype, int root) {
    gradsync_request request = 0;
    check(gradsync_broadcast(comm_, name, send, recv, count, dtype, root, &request), comm_);
    return request;
  }
  gradsync_request allgather(const char* name, const void* send, void* recv, size_t count,
                             gradsync_dtype dtype) {
    gradsync_request request = 0;
    check(gradsync_allgather(comm_, name, send, recv, count, dtype, &request), comm_);
    return request;
  }
  gradsync_request reduce_scatter(const char* name, const void* send, void* recv, size_t count,
                                  gradsync_dtype dtype, gradsync_op op) {
    gradsync_request request = 0;
    check(gradsync_reduce_scatter(comm_, name, send, recv, count, dtype, op, &request), comm_);
    return request;
  }
  gradsync_request alltoall(const char* name, const void* send, void* recv, size_t count,
                            gradsync_dtype dtype) {
    gradsync_request request = 0;
    check(gradsync_alltoall(comm_, name, send, recv, count, dtype, &request), comm_);
    return request;
  }
  gradsync_request barrier_async() {
    gradsync_request request = 0;
    check(gradsync_barrier(comm_, &request), comm_);
    return request;
  }
  void barrier() { wait(barrier_async()); }

  void group_start() { check(gradsync_group_start(comm_), comm_); }
  void group_end() { check(gradsync_group_end(comm_), comm_); }

  void wait(gradsync_request request) { check(gradsync_wait(comm_, request), comm_); }
  // Waits at most `timeout`: true when complete, false when still in flight (API version 4);
  // throws if it completed with an error.
  bool wait_for(gradsync_request request, std::chrono::milliseconds timeout) {
    const gradsync_result result =
        gradsync_wait_timeout(comm_, request, static_cast<int32_t>(timeout.count()));
    if (result == GRADSYNC_IN_PROGRESS) return false;
    check(result, comm_);
    return true;
  }
  // What the job waits for, as the daemon says (gradsync_waiting_for); empty when nothing waits.
  std::string waiting_for() {
    std::string text(4096, '\0');
    check(gradsync_waiting_for(comm_, text.data(), text.size()), comm_);
    text.resize(std::strlen(text.c_str()));
    return text;
  }
  // True when complete; throws if it completed with an error.
  bool test(gradsync_request request) {
    const gradsync_result result = gradsync_test(comm_, request);
    if (result == GRADSYNC_IN_PROGRESS) return false;
    check(result, comm_);
    return true;
  }

 private:
  gradsync_comm* comm_ = nullptr;
};

}  // namespace gradsync
