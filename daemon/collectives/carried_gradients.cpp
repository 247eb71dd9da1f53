#include "daemon/collectives/carried_gradients.h"

#include <algorithm>
#include <cassert>

namespace gradsync::daemon {

bool CarriedGradients::available(std::span<const std::string* const> names) const {
  return std::none_of(names.begin(), names.end(), [this](const std::string* name) {
    const auto it = entries_.find(*name);
    return it != entries_.end() && it->second.taken;
  });
}

std::vector<float> CarriedGradients::take(const std::string& name, uint64_t count) {
  Entry& entry = entries_[name];
  assert(!entry.taken);
  entry.taken = true;
  if (entry.values.size() != count) {
    bytes_ -= entry.values.size() * sizeof(float);
    bytes_ += count * sizeof(float);
    entry.values.assign(count, 0.0f);
  }
  return std::move(entry.values);
}

void CarriedGradients::give_back(const std::string& name, std::vector<float> values) {
  Entry& entry = entries_.at(name);
  entry.values = std::move(values);
  entry.taken = false;
}

}  // namespace gradsync::daemon
