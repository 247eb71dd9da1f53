// What a job's inter-node links (daemon/links/links.h) need of a transport: tagged messages
// between node daemons, peers that fail visibly, and operations given up on that the transport
// keeps until it can no longer touch their memory. Two implementations: the UCX mesh
// (mesh.h), and an in-process one (in_process.h) on which the inter-node algorithms are
// tested without UCX, as Gloo tests each algorithm over each of its transports.
#pragma once

#include "transport/ucx.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::transport {

using PeerId = uint32_t;

// Which of a peer's connections a message goes on. Control messages (a job's negotiation, and
// the small collectives it carries) have a connection of their own, so that they never queue
// behind the bulk data already handed to the other one: over TCP a message waits for every
// byte sent before it on its connection (docs/decisions/0020-a-connection-for-control.md).
// Order holds between two messages of one lane, not across lanes.
enum class Lane : uint8_t { kBulk = 0, kControl = 1 };

// A transport's sends at a moment: what it holds, and what it did so far. Two of these a while
// apart give the rate the link carried while the transport had more than it could take.
struct SendLoad {
  // Sends started and not finished: what the network could not take yet.
  uint64_t held_bytes = 0;
  // Sends delivered (finished without an error), ever.
  uint64_t delivered_bytes = 0;
  // Time held_bytes came to the transport's backlog or more, ever (MeshOptions::backlog_bytes).
  double backlogged_seconds = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // The peer at `address`, connecting on first use.
  virtual PeerId connect(const std::string& address) = 0;
  // The peer has accepted this daemon: sends may go to it.
  virtual bool authenticated(PeerId peer) const = 0;
  virtual bool failed(PeerId peer) const = 0;
  // Why the peer failed (empty: it has not, or gave no reason).
  virtual const std::string& failure(PeerId peer) const = 0;
  // Makes sure the peer still answers; one that does not is failed, within a bound.
  virtual void check_alive(PeerId peer) = 0;

  // `bytes` at `data` to `peer` under `tag`. With `max_message_bytes` (0: no limit), as
  // several messages of that size and the rest, in order: the receive must be posted with the
  // same limit. Messages between two peers under one tag and lane arrive in the order they
  // were sent.
  virtual Operation send(PeerId peer, uint64_t tag, const void* data, size_t bytes,
                         size_t max_message_bytes, Lane lane = Lane::kBulk) = 0;
  // Into `data`, what arrives under a tag matching `tag` on the bits of `tag_mask`, from
  // `from` (nullopt: any peer).
  virtual Operation receive(uint64_t tag, uint64_t tag_mask, void* data, size_t bytes,
                            std::optional<PeerId> from, size_t max_message_bytes) = 0;
  // Sends without an operation to wait on: the transport holds the bytes until they are out.
  // A failure shows as a failed peer.
  virtual void post(PeerId peer, uint64_t tag, std::shared_ptr<const std::vector<uint8_t>> bytes,
                    Lane lane = Lane::kBulk) = 0;
  // Operations nobody waits for any more, with the memory they may still touch: kept until
  // the transport is done with them. Receives not matched yet are cancelled.
  virtual void retire(std::vector<Operation> operations,
                      std::vector<std::shared_ptr<const void>> memory) = 0;
  // Its sends up to `now` (none where the transport cannot tell).
  virtual SendLoad send_load(std::chrono::steady_clock::time_point /*now*/) const { return {}; }
  // Moves the network along; true when it made progress.
  virtual bool progress() = 0;

  // Statistics: what a peer's messages brought (counted by whoever knows the sender), and a
  // link as a job measured it.
  virtual void count_received(PeerId peer, uint64_t bytes) = 0;
  virtual void set_link(PeerId peer, double latency_seconds, double bytes_per_second) = 0;
};

}  // namespace gradsync::transport
