// What the nodes of a job must agree on before a collective runs: its kind, size, type and
// priority.
// The response cache keeps one per name, and every cycle compares the ready collectives' with
// it, so it is compared as plain fields; it is put in words only for error messages.
#pragma once

#include "ipc/protocol.h"

#include <gradsync/gradsync.h>

#include <cstdint>
#include <string>

namespace gradsync::daemon {

struct Signature {
  ipc::Collective collective = ipc::Collective::kBarrier;
  gradsync_dtype dtype = GRADSYNC_FLOAT32;
  gradsync_op op = GRADSYNC_SUM;
  uint64_t count = 0;
  uint32_t members = 1;  // collectives in the group it leads (1: not a group)
  int32_t root = -1;     // broadcasts only
  // On device memory (any collective of the group): such collectives are staged, fused only
  // with each other and never sent with the negotiation, so the nodes must agree on it.
  bool on_device = false;
  // Every node queues it by its priority, and fuses it only with others of the same.
  int32_t priority = 0;

  bool operator==(const Signature&) const = default;
  // "allreduce, count 7, float32, sum", for mismatch errors.
  std::string describe() const;
};

}  // namespace gradsync::daemon
