#include "ipc/system.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

namespace gradsync::ipc {

SystemError::SystemError(const std::string& what, int error_number)
    : std::runtime_error(what + ": " + std::strerror(error_number)), error_number_(error_number) {}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Mapping::Mapping(int fd, uint64_t offset, size_t bytes) : bytes_(bytes) {
  void* base =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (base == MAP_FAILED) throw SystemError("mmap of " + std::to_string(bytes) + " bytes", errno);
  base_ = base;
}

Mapping Mapping::anonymous(size_t bytes) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    throw SystemError("mmap of " + std::to_string(bytes) + " anonymous bytes", errno);
  }
  return {base, bytes};
}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    unmap();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Mapping::unmap() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

UniqueFd create_sealed_memfd(const char* name, size_t bytes) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) throw SystemError("memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) throw SystemError("ftruncate", errno);
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    throw SystemError("fcntl(F_ADD_SEALS)", errno);
  }
  return fd;
}

uint64_t sealed_memfd_size(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) throw SystemError("not a memfd (F_GET_SEALS)", errno);
  if ((seals & F_SEAL_SHRINK) == 0)
    throw SystemError("memfd is not sealed against shrinking", EPERM);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw SystemError("fstat", errno);
  return static_cast<uint64_t>(st.st_size);
}

size_t page_size() {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

UniqueFd create_eventfd() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd.valid()) throw SystemError("eventfd", errno);
  return fd;
}

void eventfd_signal(int fd) {
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated: the reader is already due to wake.
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
}

void eventfd_drain(int fd) {
  uint64_t value = 0;
  [[maybe_unused]] ssize_t n = ::read(fd, &value, sizeof(value));
}

bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  struct timespec timeout {};
  struct timespec* timeout_ptr = nullptr;
  if (timeout_ns >= 0) {
    timeout.tv_sec = timeout_ns / 1'000'000'000;
    timeout.tv_nsec = timeout_ns % 1'000'000'000;
    timeout_ptr = &timeout;
  }
  const long rc = ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected,
                            timeout_ptr, nullptr, 0);
  return !(rc != 0 && errno == ETIMEDOUT);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

}  // namespace gradsync::ipc
