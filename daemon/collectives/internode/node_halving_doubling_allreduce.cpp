// Recursive halving-doubling allreduce across nodes (Rabenseifner; Thakur, Rabenseifner and
// Gropp 2005): log2(p) steps of reduce-scatter that halve the range each node owns, exchanging
// with a partner at distance p/2, p/4, ... 1, then the same steps backwards to gather. Latency
// grows with log2 of the node count instead of linearly, which wins for small tensors.
//
// Any node count: with p the largest power of two <= n, the first 2(n-p) nodes pair up; the
// even one of each pair hands its data to the odd one and sits out, and gets the result back
// at the end.
//
// A range of the work travels as one message per block of it (AllreduceOperand::
// for_each_block): one, unless fused tensors stay in place, each in its own buffer. The halving
// levels, which reduce what arrives, go in pieces of the pipeline's size (node_detail::PieceCut)
// in rounds, as the reduce-scatter does: each piece is reduced while the next ones travel, and
// a node holds a window of pieces (kWindowPieces) instead of a level's whole half. A node that
// takes in the data of a partner sitting out receives it whole.
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/reduce.h"

#include <algorithm>
#include <bit>

namespace gradsync::daemon {

NodeTask node_halving_doubling_allreduce(CollectiveContext& step, const AllreduceOperand& operand) {
  NodeLinks& links = step.links;
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  const uint64_t count = operand.count();
  const size_t element = operand.element_bytes();
  const gradsync_dtype dtype = operand.dtype();
  const gradsync_op op = node_detail::network_op(operand.op());
  const uint32_t p = std::bit_floor(n);
  const uint32_t extra = n - p;
  const auto levels = static_cast<uint32_t>(std::countr_zero(p));
  // Parts: 0 the fold-in, 1..levels halving, levels+1..2 levels doubling, 2 levels+1 the result
  // back to a node that sat out; within a part, a message per block of its range, or a halving
  // level's per piece and block.
  const uint32_t fold_back = 2 * levels + 1;
  const uint64_t messages = node_detail::kMaxWindowedPieces + operand.max_blocks();  // a part's
  if ((uint64_t{fold_back} + 1) * messages > 0x10000) {
    co_return "too many tensors fused in place for halving-doubling's message tags";
  }
  auto tag = [&](uint32_t sender, uint32_t part, uint64_t message) {
    return links.tag(tags::kData, sender, step.sequence,
                     static_cast<uint32_t>(part * messages + message));
  };

  // This node's input, reduced over its local ranks: a lone local rank's is read where it lies
  // (its send buffer) until the first reduce with a peer's data writes the work, so the input
  // costs no copy into the work first.
  bool input_is_work = false;
  operand.for_each_block(0, count, [&](uint64_t b, uint64_t e, size_t) {
    input_is_work = input_is_work || operand.sole_input(b, e) == nullptr;
  });
  if (input_is_work) operand.reduce_into(op, 0, count, nullptr);
  // Work [begin, end) = input op `received` there (one block); from then on the work is the
  // input.
  auto reduce_received = [&](uint64_t begin, uint64_t end, const uint8_t* received) {
    if (!input_is_work) {
      operand.reduce_into(op, begin, end, received);
      return;
    }
    operand.for_each_block(begin, end, [&](uint64_t b, uint64_t e, size_t) {
      uint8_t* work = operand.at(b, e);
      const void* inputs[] = {work, received + (b - begin) * element};
      void* outputs[] = {work};
      kernels::reduce_to_all(dtype, op, inputs, 2, outputs, 1, e - b, false);
    });
  };
  Flight flight(links, &step.scratch, operand.memory(), "running a halving-doubling allreduce");
  // A range to a partner, from the input (or the work, once the input is in it).
  auto send_range = [&](uint32_t to, uint32_t part, uint64_t begin, uint64_t end) {
    operand.for_each_block(begin, end, [&](uint64_t b, uint64_t e, size_t block) {
      const uint8_t* from = input_is_work ? operand.at(b, e) : operand.sole_input(b, e);
      flight.add(step.send(to, tag(me, part, block), from, (e - b) * element));
    });
  };
  // A range from a partner, into `into` (one block, the range's first element first) or, when
  // null, into place in the work; `receives` gets the operations to wait for.
  std::vector<size_t> receives;
  auto receive_range = [&](uint32_t from, uint32_t part, uint64_t begin, uint64_t end,
                           uint8_t* into) {
    receives.clear();
    operand.for_each_block(begin, end, [&](uint64_t b, uint64_t e, size_t block) {
      uint8_t* where = into != nullptr ? into + (b - begin) * element : operand.at(b, e);
      receives.push_back(
          flight.add(step.receive(tag(from, part, block), from, where, (e - b) * element)));
    });
  };
  const uint64_t all_bytes = count * element;
  if (me < 2 * extra && me % 2 == 0) {
    // Sits out: hand the data to the odd partner, get the result back.
    co_await step.pace(all_bytes);
    send_range(me + 1, 0, 0, count);
    receive_range(me + 1, fold_back, 0, count, nullptr);
    if (auto error = co_await flight.wait_all()) co_return error;
    operand.deliver(0, count);
    co_return std::nullopt;
  }
  if (me < 2 * extra) {
    uint8_t* incoming = step.scratch.get(0, std::max<uint64_t>(count * element, 1));
    receive_range(me - 1, 0, 0, count, incoming);
    for (const size_t receive : receives) {
      if (auto error = co_await flight.wait(receive)) co_return error;
    }
    reduce_received(0, count, incoming);
    input_is_work = true;
  }
  const uint32_t virtual_rank = me < 2 * extra ? me / 2 : me - extra;
  auto real_node = [extra](uint32_t v) { return v < extra ? 2 * v + 1 : v + extra; };

  // A halving level's range, from `from` on, cut in pieces alike on both sides; fn(begin, end,
  // message) for each piece p's blocks, its messages numbered on from `message`.
  using node_detail::PieceCut;
  const uint64_t piece_units = std::max<uint64_t>(step.piece_bytes / element, 1);
  auto for_each_piece_block = [&](uint64_t from, const PieceCut& cut, uint64_t p, uint64_t message,
                                  auto&& fn) {
    const auto [begin, end] = cut.range(p);
    operand.for_each_block(from + begin, from + end,
                           [&](uint64_t b, uint64_t e, size_t) { fn(b, e, message++); });
    return message;
  };

  // Halving: keep one half of the current range, send the other to the partner, in rounds:
  // round q sends piece q of the half given, then reduces piece q - 1 of the half kept, whose
  // slot then takes the piece kWindowPieces on (node_detail::kWindowPieces says why every
  // piece finds its receive posted).
  uint64_t begin = 0;
  uint64_t end = count;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // before each level, for the way back
  for (uint32_t level = 0; level < levels; ++level) {
    const uint32_t mask = p >> (level + 1);
    const uint32_t partner = real_node(virtual_rank ^ mask);
    const uint32_t part = 1 + level;
    ranges.emplace_back(begin, end);
    const uint64_t middle = begin + (end - begin) / 2;
    const bool lower = (virtual_rank & mask) == 0;
    const uint64_t keep_begin = lower ? begin : middle;
    const uint64_t keep_end = lower ? middle : end;
    const uint64_t give_begin = lower ? middle : begin;
    const uint64_t give_end = lower ? end : middle;
    const PieceCut kept(keep_end - keep_begin, piece_units);
    const PieceCut given(give_end - give_begin, piece_units);
    // Earlier levels' receives are over: the slots may move as they grow.
    uint8_t* incoming =
        step.scratch.get(0, std::max<uint64_t>(kept.slots * kept.piece * element, 1));
    auto slot = [&](uint64_t piece) {
      return incoming + (piece % kept.slots) * kept.piece * element;
    };
    std::vector<uint64_t> first_message(kept.pieces + 1, 0);
    for (uint64_t q = 0; q < kept.pieces; ++q) {
      first_message[q + 1] =
          for_each_piece_block(keep_begin, kept, q, first_message[q], [](auto, auto, auto) {});
    }
    std::vector<size_t> arrivals(first_message[kept.pieces]);  // the flight's receive of each
    auto expect_piece = [&](uint64_t piece) {
      const uint64_t piece_begin = keep_begin + kept.range(piece).first;
      for_each_piece_block(keep_begin, kept, piece, first_message[piece],
                           [&](uint64_t b, uint64_t e, uint64_t message) {
                             uint8_t* where = slot(piece) + (b - piece_begin) * element;
                             arrivals[message] = flight.add(step.receive(
                                 tag(partner, part, message), partner, where, (e - b) * element));
                           });
    };
    for (uint64_t q = 0; q < kept.slots; ++q) expect_piece(q);
    uint64_t given_message = 0;
    const uint64_t rounds = std::max(kept.pieces, given.pieces);
    for (uint64_t q = 0; q <= rounds; ++q) {
      if (q < given.pieces) {
        const auto [piece_begin, piece_end] = given.range(q);
        co_await step.pace((piece_end - piece_begin) * element);
        given_message = for_each_piece_block(
            give_begin, given, q, given_message, [&](uint64_t b, uint64_t e, uint64_t message) {
              const uint8_t* from = input_is_work ? operand.at(b, e) : operand.sole_input(b, e);
              flight.add(step.send(partner, tag(me, part, message), from, (e - b) * element));
            });
      }
      if (q == 0 || q - 1 >= kept.pieces) continue;
      const uint64_t piece = q - 1;
      for (uint64_t message = first_message[piece]; message < first_message[piece + 1]; ++message) {
        if (auto error = co_await flight.wait(arrivals[message])) co_return error;
      }
      const auto [piece_begin, piece_end] = kept.range(piece);
      // Until the level is over the work outside what it reduced is not the input yet: the
      // pieces given still read the input.
      reduce_received(keep_begin + piece_begin, keep_begin + piece_end, slot(piece));
      if (piece + kept.slots < kept.pieces) expect_piece(piece + kept.slots);
    }
    input_is_work = true;
    // The sends just posted read the input or the work, which later levels do not write
    // outside this level's kept half.
    begin = keep_begin;
    end = keep_end;
  }
  // No level wrote the work (one node: admission makes that a local job, but the algorithm
  // does not rely on it): the input goes to the work as it is.
  if (!input_is_work) {
    operand.reduce_into(op, 0, count, nullptr);
    input_is_work = true;
  }
  if (operand.op() == GRADSYNC_AVG) {
    operand.for_each_block(begin, end, [&](uint64_t b, uint64_t e, size_t) {
      kernels::divide(dtype, operand.at(b, e), e - b, static_cast<uint64_t>(step.world_size));
    });
  }
  // Doubling: the same partners backwards; each sends what it has and receives the other half.
  for (uint32_t level = levels; level-- > 0;) {
    const uint32_t mask = p >> (level + 1);
    const uint32_t partner = real_node(virtual_rank ^ mask);
    const auto [outer_begin, outer_end] = ranges[level];
    const bool lower = (virtual_rank & mask) == 0;
    const uint64_t other_begin = lower ? end : outer_begin;
    const uint64_t other_end = lower ? outer_end : begin;
    receive_range(partner, 2 * levels - level, other_begin, other_end, nullptr);
    co_await step.pace((end - begin) * element);
    send_range(partner, 2 * levels - level, begin, end);
    for (const size_t receive : receives) {
      if (auto error = co_await flight.wait(receive)) co_return error;
    }
    begin = outer_begin;
    end = outer_end;
  }
  if (me < 2 * extra) {
    co_await step.pace(all_bytes);
    send_range(me - 1, fold_back, 0, count);
  }
  operand.deliver(0, count);
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
