// Direct allreduce across nodes: a reduce-scatter in which every node sends each other node its
// partial sums of that node's share straight away, then an allgather of the finished shares;
// two steps, each moving (n-1)/n of the data in and out of every node (the ring's bytes, in 2
// steps instead of 2(n-1)).
//
// Its point is the order of the additions. Node c owns a fixed share of the elements and adds
// the nodes' partial sums of it in node order, every node's partial sum being its local ranks'
// inputs added in local rank order: each element's result is
//   ((node 0's sum + node 1's sum) + node 2's sum) + ...,
// whichever node owns it, however the tensors were fused and wherever an element falls in the
// fused buffer. Small allreduces that piggyback on the negotiation, and aggregators, add in the
// same order. So a job that forces this algorithm gets the same bits for the same inputs on the
// same nodes, run after run, which the ring and halving-doubling (whose order depends on an
// element's place in the work) and the measured choice between them cannot promise.
//
// Pipelined: each share is cut into pieces; a node sends every other node its partial sums of
// one piece ahead of finishing the piece of its own share whose sums are all there, and a
// finished piece goes to every other node at once.
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/reduce.h"

#include <algorithm>
#include <vector>

namespace gradsync::daemon {
namespace {

// Pieces of a share, at most: a piece's tag part holds its step (2) times this in 16 bits.
constexpr uint64_t kMaxPiecesPerShare = 1024;
static_assert(2 * kMaxPiecesPerShare <= 0x10000, "pieces overflow the tag's part");

constexpr uint32_t kPartialSums = 0;  // a node's sums of another's share, to that node
constexpr uint32_t kFinished = 1;     // the owner's finished piece, to every other node

}  // namespace

NodeTask node_direct_allreduce(CollectiveContext& step, const AllreduceOperand& operand) {
  NodeLinks& links = step.links;
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  const uint64_t count = operand.count();
  const size_t element = operand.element_bytes();
  const gradsync_dtype dtype = operand.dtype();
  const gradsync_op op = node_detail::network_op(operand.op());
  if (operand.max_blocks() != 1) co_return "the direct allreduce needs the work in one block";

  // Node c's share: elements [share(c), share(c + 1)). Every node cuts the shares alike, into
  // pieces of one size.
  auto share = [&](uint32_t c) { return count * c / n; };
  const uint64_t largest = (count + n - 1) / n;
  const uint64_t piece = std::max<uint64_t>(
      {step.piece_bytes / element, (largest + kMaxPiecesPerShare - 1) / kMaxPiecesPerShare, 1});
  auto pieces_of = [&](uint32_t c) { return (share(c + 1) - share(c) + piece - 1) / piece; };
  const uint64_t most_pieces = (largest + piece - 1) / piece;  // some share is the largest
  auto piece_range = [&](uint32_t c, uint64_t p) {
    const uint64_t begin = share(c) + p * piece;
    return std::pair{begin, std::min(share(c + 1), begin + piece)};
  };
  // This node's sum of elements [begin, end): a lone local rank's input where it lies, else the
  // local ranks' sum, written into the work.
  auto local_sum = [&](uint64_t begin, uint64_t end) {
    if (const uint8_t* input = operand.sole_input(begin, end)) return input;
    operand.reduce_into(op, begin, end, nullptr);
    return static_cast<const uint8_t*>(operand.at(begin, end));
  };
  auto tag = [&](uint32_t sender, uint32_t part, uint64_t p) {
    return links.tag(tags::kData, sender, step.sequence,
                     static_cast<uint32_t>(part * kMaxPiecesPerShare + p));
  };

  Flight flight(links, &step.scratch, operand.memory(), "running a direct allreduce");
  // Every other node's partial sums of this node's share: a window of pieces from each, piece p
  // in slot p % slots.
  const uint64_t own_pieces = pieces_of(me);
  const uint64_t slots = std::min(own_pieces, node_detail::kWindowPieces);
  uint8_t* arrivals = step.scratch.get(0, std::max<uint64_t>((n - 1) * slots * piece * element, 1));
  auto arrival = [&](uint32_t node, uint64_t p) {
    return arrivals + ((node < me ? node : node - 1) * slots + p % slots) * piece * element;
  };
  std::vector<std::vector<size_t>> arriving(n);  // by node, the flight's receive of piece p
  auto expect_piece = [&](uint64_t p) {
    const auto [begin, end] = piece_range(me, p);
    for (uint32_t node = 0; node < n; ++node) {
      if (node == me) continue;
      arriving[node].push_back(flight.add(step.receive(tag(node, kPartialSums, p), node,
                                                       arrival(node, p), (end - begin) * element)));
    }
  };
  for (uint64_t p = 0; p < slots; ++p) expect_piece(p);

  std::vector<std::vector<size_t>> finished(n);  // each owner's finished pieces, landing in place
  std::vector<const void*> inputs(n);
  // Round q sends the partial sums of piece q, then finishes piece q - 1 of the own share: the
  // link carries one piece while the one before it is summed.
  for (uint64_t q = 0; q <= most_pieces; ++q) {
    for (uint32_t k = 1; k < n && q < most_pieces; ++k) {
      const uint32_t owner = (me + k) % n;  // to the right first: not every node to node 0
      if (q >= pieces_of(owner)) continue;
      const auto [begin, end] = piece_range(owner, q);
      // Written into the work, the sums leave from a range the owner's finished piece
      // overwrites only once they have reached it.
      const uint8_t* source = local_sum(begin, end);
      co_await step.pace((end - begin) * element);
      flight.add(step.send(owner, tag(me, kPartialSums, q), source, (end - begin) * element));
      finished[owner].push_back(flight.add(step.receive(
          tag(owner, kFinished, q), owner, operand.at(begin, end), (end - begin) * element)));
    }
    if (q == 0 || q - 1 >= own_pieces) continue;
    const uint64_t p = q - 1;
    for (uint32_t node = 0; node < n; ++node) {
      if (node == me) continue;
      if (auto error = co_await flight.wait(arriving[node][p])) co_return error;
    }
    const auto [begin, end] = piece_range(me, p);
    const uint8_t* own = local_sum(begin, end);
    for (uint32_t node = 0; node < n; ++node) {
      inputs[node] = node == me ? own : arrival(node, p);
    }
    uint8_t* result = operand.at(begin, end);
    void* outputs[] = {result};
    kernels::reduce_to_all(dtype, op, inputs.data(), n, outputs, 1, end - begin, false);
    if (p + slots < own_pieces) expect_piece(p + slots);  // into the slot just summed
    if (operand.op() == GRADSYNC_AVG) {
      kernels::divide(dtype, result, end - begin, static_cast<uint64_t>(step.world_size));
    }
    for (uint32_t k = 1; k < n; ++k) {
      const uint32_t node = (me + k) % n;
      co_await step.pace((end - begin) * element);
      flight.add(step.send(node, tag(me, kFinished, p), result, (end - begin) * element));
    }
    operand.deliver(begin, end);
  }
  for (uint32_t k = 1; k < n; ++k) {
    const uint32_t owner = (me + k) % n;
    for (uint64_t p = 0; p < finished[owner].size(); ++p) {
      if (auto error = co_await flight.wait(finished[owner][p])) co_return error;
      const auto [begin, end] = piece_range(owner, p);
      operand.deliver(begin, end);
    }
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
