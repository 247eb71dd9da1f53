// What the top-k wire codec held back of each tensor of a job (error feedback): per tensor
// name, added to that tensor's next allreduce. An allreduce takes its tensors' values out for
// as long as it runs and gives them back; a later allreduce of the same name (the next step's,
// started while this one still runs) waits for them, so that each step adds what the step
// before it held back.
//
// Bounded: past `max_tensors` names, the least recently used one goes, with what it held
// (a tensor name that recurs is what error feedback is for; one that never comes back, such as
// a job's unnamed collectives, would otherwise hold its values for the job's life).
#pragma once

#include "daemon/links/node_task.h"

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace gradsync::daemon {

class Residuals {
 public:
  explicit Residuals(size_t max_tensors = kDefaultMaxTensors) : max_tensors_(max_tensors) {}
  static constexpr size_t kDefaultMaxTensors = 4096;

  // None of `names` is taken out.
  bool available(std::span<const std::string* const> names) const;
  // The values held back for `name`, `count` of them: zeros for a tensor not seen before, or
  // whose size changed. The name is taken out until give_back(); it must be available.
  std::vector<float> take(const std::string& name, uint64_t count);
  void give_back(const std::string& name, std::vector<float> values);
  // Held for the job, taken out or not.
  uint64_t bytes() const { return bytes_; }
  size_t tensors() const { return entries_.size(); }
  // Names dropped, with what they held, to stay within max_tensors.
  uint64_t evicted() const { return evicted_; }

 private:
  struct Entry {
    std::vector<float> values;
    bool taken = false;
    uint64_t last_use = 0;
  };
  bool evict_least_recent();  // false: every entry is taken out

  size_t max_tensors_;
  std::unordered_map<std::string, Entry> entries_;
  uint64_t bytes_ = 0;
  uint64_t uses_ = 0;
  uint64_t evicted_ = 0;
};

// Until every one of `names` is available (co_await in a NodeTask). Bounded by the allreduces
// that hold them, which the peer timeout bounds.
class ResidualsWait final : public NodeWait {
 public:
  ResidualsWait(const Residuals& residuals, std::span<const std::string* const> names)
      : residuals_(&residuals), names_(names) {}
  bool ready() override { return residuals_->available(names_); }
  NodeResult take_result() { return std::nullopt; }

 private:
  const Residuals* residuals_;
  std::span<const std::string* const> names_;
};

}  // namespace gradsync::daemon
