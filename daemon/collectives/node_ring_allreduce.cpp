// Ring allreduce across nodes: a reduce-scatter then an allgather, 2(n-1) steps that each move
// 1/n of the data to the right-hand neighbour (bandwidth-optimal: every node sends and
// receives 2(n-1)/n of the data, whatever n is).
//
// Pipelined: each step's slice is cut into pieces that travel independently. A piece is
// reduced the moment it arrives, together with the local ranks' inputs for it (so the local
// reduce costs no pass of its own), and sent straight on, while later pieces are still on the
// wire. In the allgather, each finished piece is forwarded first and copied to the other local
// ranks while it travels.
#include "daemon/collectives/node_collectives.h"
#include "daemon/node/cost_model.h"
#include "kernels/reduce.h"

#include <algorithm>
#include <array>

namespace gradsync::daemon {
namespace {

// Pieces per step: enough that a piece stays at kPipelinePieceBytes up to 32 MiB of a node's
// share. Bigger pieces cost more than their bytes: an eager message that arrives before its
// receive is posted is buffered whole by UCX (2 namespace nodes, 128-256 MiB: 16 pieces gave
// 1.2-1.6 GB/s of bus bandwidth, 64 pieces 1.5-1.9). A piece's tag part counts steps times
// pieces in 16 bits.
constexpr uint64_t kMaxPieces = 64;
static_assert(uint64_t{2} * (kMaxNodes - 1) * kMaxPieces <= 0x10000,
              "pieces overflow the tag's part");

struct Range {
  uint64_t begin;
  uint64_t end;
};

}  // namespace

NodeTask node_ring_allreduce(NodeStep& step, const AllreduceOperand& operand) {
  NodeLinks& links = step.links;
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  const uint32_t right = (me + 1) % n;
  const uint32_t left = (me + n - 1) % n;
  const uint64_t count = operand.count();
  const size_t element = operand.element_bytes();
  const gradsync_op op = node_detail::network_op(operand.op());
  uint8_t* work = operand.work();
  // Every node computes the same cut: it depends on the count and node count only.
  const auto pieces = static_cast<uint32_t>(
      std::clamp<uint64_t>(count / n * element / kPipelinePieceBytes, 1, kMaxPieces));
  auto chunk_of = [n](int64_t c) { return static_cast<uint32_t>(((c % n) + n) % n); };
  auto piece = [&](uint32_t chunk, uint32_t j) {
    const uint64_t begin = count * chunk / n;
    const uint64_t end = count * (chunk + 1) / n;
    return Range{begin + (end - begin) * j / pieces, begin + (end - begin) * (j + 1) / pieces};
  };
  auto bytes = [element](Range r) { return (r.end - r.begin) * element; };
  // Parts: reduce-scatter steps 0..n-2, then allgather steps n-1..2n-3; pieces within.
  auto tag = [&](uint32_t sender, uint32_t part_step, uint32_t j) {
    return links.tag(tags::kData, sender, step.sequence, part_step * pieces + j);
  };
  const uint32_t steps = n - 1;
  if (steps == 0) co_return "a ring needs two nodes or more";  // NodeJob runs rhd on one

  Flight flight(links, &step.scratch, operand.memory(), "running a ring allreduce");
  // Reduce-scatter step s receives chunk me-s-1 from the left; two slots alternate so that the
  // next step's receives are posted while this step's pieces are reduced.
  const uint64_t slot_bytes = (count / n + 1) * element;
  std::array<uint8_t*, 2> incoming = {step.scratch.get(0, slot_bytes),
                                      step.scratch.get(1, slot_bytes)};
  std::array<std::vector<size_t>, 2> posted;
  auto post_reduce_scatter_receives = [&](uint32_t s) {
    auto& ops = posted[s % 2];
    ops.clear();
    const uint32_t chunk = chunk_of(int64_t{me} - s - 1);
    const uint64_t chunk_begin = count * chunk / n;
    for (uint32_t j = 0; j < pieces; ++j) {
      const Range r = piece(chunk, j);
      ops.push_back(flight.add(links.receive(
          tag(left, s, j), left, incoming[s % 2] + (r.begin - chunk_begin) * element, bytes(r))));
    }
  };
  // Step 0 sends this node's own chunk, reduced over the local ranks.
  std::vector<size_t> reduce_scatter_sends;
  post_reduce_scatter_receives(0);
  for (uint32_t j = 0; j < pieces; ++j) {
    const Range r = piece(me, j);
    operand.reduce_into(op, r.begin, r.end, nullptr);
    reduce_scatter_sends.push_back(
        flight.add(links.send(right, tag(me, 0, j), work + r.begin * element, bytes(r))));
  }
  for (uint32_t s = 0; s < steps; ++s) {
    if (s + 1 < steps) post_reduce_scatter_receives(s + 1);
    const uint32_t chunk = chunk_of(int64_t{me} - s - 1);
    const uint64_t chunk_begin = count * chunk / n;
    for (uint32_t j = 0; j < pieces; ++j) {
      if (auto error = co_await flight.wait(posted[s % 2][j])) co_return error;
      const Range r = piece(chunk, j);
      operand.reduce_into(op, r.begin, r.end, incoming[s % 2] + (r.begin - chunk_begin) * element);
      if (s + 1 == steps && operand.op() == GRADSYNC_AVG) {
        // This node's finished chunk: the average's one division happens here.
        kernels::divide(operand.dtype(), work + r.begin * element, r.end - r.begin,
                        static_cast<uint64_t>(step.world_size));
      }
      // Sent on as the next reduce-scatter step, or, finished, as the first allgather step.
      const size_t send =
          flight.add(links.send(right, tag(me, s + 1, j), work + r.begin * element, bytes(r)));
      if (s + 1 < steps) reduce_scatter_sends.push_back(send);
    }
  }
  // Allgather step s receives chunk me-s straight into place, so the reduce-scatter send that
  // read it must be done first; these sends matched receives the right neighbour posted during
  // its own reduce-scatter. (Not the first allgather sends: the right neighbour posts their
  // receives only after this point, and waiting for them here would deadlock the ring.)
  for (const size_t send : reduce_scatter_sends) {
    if (auto error = co_await flight.wait(send)) co_return error;
  }
  std::vector<std::vector<size_t>> gathers(steps);
  for (uint32_t s = 0; s < steps; ++s) {
    const uint32_t chunk = chunk_of(int64_t{me} - s);
    for (uint32_t j = 0; j < pieces; ++j) {
      const Range r = piece(chunk, j);
      gathers[s].push_back(flight.add(
          links.receive(tag(left, steps + s, j), left, work + r.begin * element, bytes(r))));
    }
  }
  // The chunk finished here goes to the local ranks while the first receives arrive.
  const uint32_t own = chunk_of(int64_t{me} + 1);
  operand.deliver(piece(own, 0).begin, piece(own, pieces - 1).end);
  for (uint32_t s = 0; s < steps; ++s) {
    const uint32_t chunk = chunk_of(int64_t{me} - s);
    for (uint32_t j = 0; j < pieces; ++j) {
      if (auto error = co_await flight.wait(gathers[s][j])) co_return error;
      const Range r = piece(chunk, j);
      if (s + 1 < steps) {
        flight.add(
            links.send(right, tag(me, steps + s + 1, j), work + r.begin * element, bytes(r)));
      }
      operand.deliver(r.begin, r.end);
    }
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
