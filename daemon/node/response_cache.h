// The response cache of a multi-node job (Horovod's scheme, among node daemons): a collective
// the nodes have agreed on once gets a bit; from then on one bit-vector exchange per cycle
// decides whether it runs, with no names on the wire.
//
// Every node keeps its own copy, and the copies stay identical because every change (put,
// touch, erase) happens while applying a negotiation cycle, in the same order on every node.
// So nothing here may depend on local state: bits are reused lowest-first and eviction is
// least-recently-used by the agreed order.
#pragma once

#include "daemon/node/signature.h"

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace gradsync::daemon {

class ResponseCache {
 public:
  // capacity 0 disables the cache: every collective is reported by name (negotiator.h).
  explicit ResponseCache(uint32_t capacity) : capacity_(capacity) {}

  uint32_t capacity() const { return capacity_; }
  size_t size() const { return by_key_.size(); }

  struct Entry {
    uint32_t bit;
    const Signature& signature;
  };
  std::optional<Entry> find(const std::string& key) const;
  // The key holding `bit`, or null when the bit is free.
  const std::string* key_of(uint32_t bit) const;
  // The signature cached under `bit`, which must be in use.
  const Signature& signature_of(uint32_t bit) const { return slots_[bit].signature; }
  // Changes whenever a key gains, loses or changes its bit or signature (not when it is only
  // used): a bit remembered at one generation still holds at the same generation.
  uint64_t generation() const { return generation_; }

  // Caches key with its signature (or refreshes it) and returns its bit. When full, evicts the
  // least recently used entry first; its key is returned in *evicted.
  uint32_t put(const std::string& key, const Signature& signature,
               std::optional<std::string>* evicted = nullptr);
  // Marks the entry of `bit` as just used.
  void touch(uint32_t bit);
  void erase(uint32_t bit);

  // One more than the highest bit in use (the length of the bit vectors to exchange).
  uint32_t bit_span() const { return static_cast<uint32_t>(slots_.size()); }

 private:
  struct Slot {
    std::string key;
    Signature signature;
    std::list<uint32_t>::iterator lru;  // position in lru_
    bool used = false;
  };

  uint32_t capacity_;
  uint64_t generation_ = 0;
  std::vector<Slot> slots_;  // by bit
  std::unordered_map<std::string, uint32_t> by_key_;
  std::list<uint32_t> lru_;  // bits, most recently used first
};

}  // namespace gradsync::daemon
