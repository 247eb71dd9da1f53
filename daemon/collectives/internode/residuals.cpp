#include "daemon/collectives/internode/residuals.h"

#include <algorithm>
#include <cassert>

namespace gradsync::daemon {

bool Residuals::available(std::span<const std::string* const> names) const {
  return std::none_of(names.begin(), names.end(), [this](const std::string* name) {
    const auto it = entries_.find(*name);
    return it != entries_.end() && it->second.taken;
  });
}

std::vector<float> Residuals::take(const std::string& name, uint64_t count) {
  Entry& entry = entries_[name];
  assert(!entry.taken);
  entry.taken = true;
  entry.last_use = ++uses_;
  if (entry.values.size() != count) {
    bytes_ -= entry.values.size() * sizeof(float);
    bytes_ += count * sizeof(float);
    entry.values.assign(count, 0.0f);
  }
  return std::move(entry.values);
}

void Residuals::give_back(const std::string& name, std::vector<float> values) {
  Entry& entry = entries_.at(name);
  entry.values = std::move(values);
  entry.taken = false;
  while (entries_.size() > max_tensors_ && evict_least_recent()) {
  }
}

bool Residuals::evict_least_recent() {
  // Rare (a job past the bound), and linear in the bound: no index kept for it.
  auto oldest = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (!it->second.taken &&
        (oldest == entries_.end() || it->second.last_use < oldest->second.last_use)) {
      oldest = it;
    }
  }
  if (oldest == entries_.end()) return false;  // every one taken out: they come back later
  bytes_ -= oldest->second.values.size() * sizeof(float);
  entries_.erase(oldest);
  ++evicted_;
  return true;
}

}  // namespace gradsync::daemon
