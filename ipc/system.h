// RAII owners for the kernel objects both sides use: file descriptors, mappings, memfds, and
// the futex calls behind the doorbells. Failures throw SystemError with the call and errno.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace gradsync::ipc {

class SystemError : public std::runtime_error {
 public:
  SystemError(const std::string& what, int error_number);
  int error_number() const { return error_number_; }

 private:
  int error_number_;
};

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A MAP_SHARED mapping of a file descriptor's range, or private anonymous memory.
class Mapping {
 public:
  Mapping() = default;
  Mapping(int fd, uint64_t offset, size_t bytes);  // offset must be page-aligned
  // Private memory of this process. It reads as zeros, every page of it the kernel's one page
  // of zeros until it is written.
  static Mapping anonymous(size_t bytes);
  Mapping(Mapping&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { unmap(); }

  void* data() const { return base_; }
  size_t size() const { return bytes_; }

 private:
  Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  void unmap();
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// A memfd of `bytes`, sealed against shrinking and growing so that a mapping of it can never
// fault with SIGBUS in the process that did not create it.
UniqueFd create_sealed_memfd(const char* name, size_t bytes);

// Checks that `fd` is a memfd sealed against shrinking and returns its size.
uint64_t sealed_memfd_size(int fd);

size_t page_size();

UniqueFd create_eventfd();
void eventfd_signal(int fd);
void eventfd_drain(int fd);

// Process-shared futex on a word in a MAP_SHARED mapping.
// Returns false when `timeout_ns` elapsed (timeout_ns < 0: no timeout).
bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns);
void futex_wake_all(std::atomic<uint32_t>* word);

}  // namespace gradsync::ipc
