#include "daemon/node/response_cache.h"

#include <algorithm>
#include <stdexcept>

namespace gradsync::daemon {

std::optional<ResponseCache::Entry> ResponseCache::find(const std::string& key) const {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return std::nullopt;
  return Entry{it->second, slots_[it->second].signature};
}

const std::string* ResponseCache::key_of(uint32_t bit) const {
  if (bit >= slots_.size() || !slots_[bit].used) return nullptr;
  return &slots_[bit].key;
}

uint32_t ResponseCache::put(const std::string& key, const Signature& signature,
                            std::optional<std::string>* evicted) {
  if (evicted != nullptr) evicted->reset();
  ++generation_;
  if (const auto it = by_key_.find(key); it != by_key_.end()) {
    slots_[it->second].signature = signature;
    touch(it->second);
    return it->second;
  }
  if (capacity_ == 0) throw std::logic_error("put into a disabled response cache");
  if (by_key_.size() >= capacity_) {
    const uint32_t victim = lru_.back();
    if (evicted != nullptr) *evicted = slots_[victim].key;
    erase(victim);
  }
  // The lowest free bit keeps the vectors short, and is the same choice on every node.
  const auto free_slot =
      std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.used; });
  const auto bit = static_cast<uint32_t>(free_slot - slots_.begin());
  if (free_slot == slots_.end()) slots_.emplace_back();
  Slot& slot = slots_[bit];
  slot.key = key;
  slot.signature = signature;
  slot.used = true;
  lru_.push_front(bit);
  slot.lru = lru_.begin();
  by_key_.emplace(key, bit);
  return bit;
}

void ResponseCache::touch(uint32_t bit) {
  Slot& slot = slots_.at(bit);
  if (!slot.used) return;
  lru_.splice(lru_.begin(), lru_, slot.lru);
}

void ResponseCache::erase(uint32_t bit) {
  Slot& slot = slots_.at(bit);
  if (!slot.used) return;
  ++generation_;
  by_key_.erase(slot.key);
  lru_.erase(slot.lru);
  slot = Slot{};
  while (!slots_.empty() && !slots_.back().used) slots_.pop_back();
}

}  // namespace gradsync::daemon
