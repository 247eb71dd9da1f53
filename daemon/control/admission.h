// What the control thread admits of a client's control messages: every field of a hello
// checked before the client may join, a registered range checked against its memory. Pure
// functions of the message (no sockets, no state), so that the fuzzer and the tests call them
// as the control thread does.
#pragma once

#include "daemon/job/session.h"
#include "ipc/protocol.capnp.h"

#include <gradsync/gradsync.h>

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace gradsync::daemon {

// A request the control thread refuses: replied to the sender as an Error.
struct Refusal {
  gradsync_result code;
  std::string message;
};

struct HelloRules {
  std::string listen_address;      // this daemon's inter-node address; empty: it has none
  std::string default_algorithm;   // allreduce_algorithm
  std::string default_wire_codec;  // allreduce_wire_codec
  bool default_autotune = false;   // autotune
  std::vector<std::string> default_aggregators;  // aggregators
  bool serves_ranks = true;  // false on an aggregator (role), which refuses every client
};

// The identity a hello claims, checked for consistency (not against other clients: the
// control thread does that). Throws Refusal.
ClientIdentity validate_hello(ipc::wire::Hello::Reader hello, pid_t pid, uid_t uid,
                              const HelloRules& rules);

// [offset, offset + bytes) inside a memory of `size` bytes, not empty. Throws Refusal.
void validate_range(uint32_t buffer_id, uint64_t offset, uint64_t bytes, uint64_t size);

}  // namespace gradsync::daemon
