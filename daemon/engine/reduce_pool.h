// A small fork-join pool for the memory-bound local stages. The calling thread works too, so a
// pool of size 1 has no threads and no hand-off cost.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gradsync::daemon {

class ReducePool {
 public:
  explicit ReducePool(unsigned size);  // 0: one per CPU this process may run on
  ~ReducePool();
  ReducePool(const ReducePool&) = delete;
  ReducePool& operator=(const ReducePool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Runs part(i) for i in [0, parts), parts <= size(); returns when all have run.
  void run(unsigned parts, const std::function<void(unsigned)>& part);

 private:
  void worker(unsigned index);

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  uint64_t generation_ = 0;
  unsigned parts_ = 0;
  unsigned remaining_ = 0;
  bool stopping_ = false;
  const std::function<void(unsigned)>* part_ = nullptr;
  std::vector<std::thread> workers_;
};

}  // namespace gradsync::daemon
