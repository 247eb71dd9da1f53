// Bulk transfers between two gradsync-transport-bench processes over the daemons' own transport
// (transport/mesh.h), cut and paced as the ring allreduce sends its pieces: every receive of a
// transfer posted at its start, at most two of its own pieces unfinished at a time (or as many
// as asked).
#pragma once

#include "transport/mesh.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradsync::tools {

using Clock = std::chrono::steady_clock;

// What the sending side sends from. Written: a pattern, every page its own, as a daemon sends
// a job's data. Untouched: memory never written, every page of which the kernel maps to its one
// page of zeros, so that its copies into the socket read from cache: what `ucx_perftest`
// sends, for comparing with it. Both sides must be told the same (the receiver checks bytes).
enum class SendMemory { kWritten, kUntouched };

struct TransferSettings {
  uint64_t bytes = 64 << 20;  // per transfer and direction
  uint64_t piece_bytes = 4 << 20;
  // Sends unfinished at most: 2 as the ring sends its own chunk
  // (daemon/collectives/internode/node_ring_allreduce.cpp).
  size_t pieces_ahead = 2;
  uint32_t transfers = 10;  // timed
  uint32_t warmup = 2;      // before them, not timed
  SendMemory send_memory = SendMemory::kWritten;
  Clock::time_point deadline;  // every wait ends here, with an error
};

// What one side (a mesh and the thread that drives it) did in its timed transfers.
struct SideResult {
  double seconds = 0;
  uint64_t bytes = 0;  // sent or received, per direction
};

// The peer at `address` as each of `meshes` reaches it, accepted by it (retried while it is
// not listening yet). Every mesh is progressed meanwhile: a side's meshes answer the other
// side's connections only as they are.
std::vector<transport::PeerId> connect_all(const std::vector<transport::Mesh*>& meshes,
                                           const std::string& address, Clock::time_point deadline);

// Runs the transfers of one side on `mesh`: sends to `send_to` (if any) and receives from any
// peer (with `receives`), each transfer both ways at once; after the timed ones, one more whose
// bytes it checks.
// Throws std::runtime_error on a failed operation, a wrong byte or the deadline.
SideResult run_side(transport::Mesh& mesh, std::optional<transport::PeerId> send_to, bool receives,
                    const TransferSettings& settings);

// Ends a run without losing bytes in flight, over `mesh`'s connection to `peer`. One side
// leaves first: it says it has everything (where it received) and waits for the other's last
// word before it goes. The other stays: it waits for that (where it sent), says its last word
// (it has everything too) and waits until the first has gone, so that no side goes while a
// message to it is still on its way.
enum class Leaving { kFirst, kLast };
void finish(transport::Mesh& mesh, transport::PeerId peer, Leaving leaving, bool sent,
            Clock::time_point deadline);

}  // namespace gradsync::tools
