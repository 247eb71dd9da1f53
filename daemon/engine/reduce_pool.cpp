#include "daemon/engine/reduce_pool.h"

#include <sched.h>

#include <algorithm>

namespace gradsync::daemon {

namespace {

// The CPUs this process may run on (its affinity: a service's CPUAffinity, a taskset), where
// the machine's online CPUs would be too many: threads beyond them only take turns, and a
// fork-join stage waits for the last part.
unsigned usable_cpus() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (::sched_getaffinity(0, sizeof(cpus), &cpus) == 0) {
    return std::max(1, CPU_COUNT(&cpus));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

ReducePool::ReducePool(unsigned size) {
  if (size == 0) size = usable_cpus();
  for (unsigned i = 1; i < size; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ReducePool::~ReducePool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) t.join();
}

void ReducePool::run(unsigned parts, const std::function<void(unsigned)>& part) {
  parts = std::min(parts, size());
  if (parts <= 1) {
    if (parts == 1) part(0);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    part_ = &part;
    parts_ = parts;
    remaining_ = parts - 1;
    ++generation_;
  }
  work_ready_.notify_all();
  part(0);
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, [this] { return remaining_ == 0; });
  part_ = nullptr;
}

void ReducePool::worker(unsigned index) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  while (true) {
    work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    if (index >= parts_) continue;
    const auto* part = part_;
    lock.unlock();
    (*part)(index);
    lock.lock();
    if (--remaining_ == 0) work_done_.notify_one();
  }
}

}  // namespace gradsync::daemon
