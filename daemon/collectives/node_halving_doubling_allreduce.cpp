// Recursive halving-doubling allreduce across nodes (Rabenseifner; Thakur, Rabenseifner and
// Gropp 2005): log2(p) steps of reduce-scatter that halve the range each node owns, exchanging
// with a partner at distance p/2, p/4, ... 1, then the same steps backwards to gather. Latency
// grows with log2 of the node count instead of linearly, which wins for small tensors.
//
// Any node count: with p the largest power of two <= n, the first 2(n-p) nodes pair up; the
// even one of each pair hands its data to the odd one and sits out, and gets the result back
// at the end.
#include "daemon/collectives/node_collectives.h"
#include "kernels/reduce.h"

#include <algorithm>
#include <bit>

namespace gradsync::daemon {

NodeTask node_halving_doubling_allreduce(NodeStep& step, const AllreduceOperand& operand) {
  NodeLinks& links = step.links;
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  const uint64_t count = operand.count();
  const size_t element = operand.element_bytes();
  const gradsync_dtype dtype = operand.dtype();
  const gradsync_op op = node_detail::network_op(operand.op());
  uint8_t* work = operand.work();
  const uint32_t p = std::bit_floor(n);
  const uint32_t extra = n - p;
  const auto levels = static_cast<uint32_t>(std::countr_zero(p));
  // Parts: 0 the fold-in, 1..levels halving, levels+1..2 levels doubling, 2 levels+1 the result
  // back to a node that sat out.
  auto tag = [&](uint32_t sender, uint32_t part) {
    return links.tag(tags::kData, sender, step.sequence, part);
  };
  const uint32_t fold_back = 2 * levels + 1;

  // This node's input, reduced over its local ranks: a lone local rank's is read where it lies
  // (its send buffer) until the first reduce with a peer's data writes the work buffer, so the
  // input costs no copy into work first.
  const uint8_t* input = operand.sole_input(0, count);
  if (input == nullptr) {
    operand.reduce_into(op, 0, count, nullptr);
    input = work;
  }
  // work[begin, end) = input op `received` there; from then on work is the input.
  auto reduce_received = [&](uint64_t begin, uint64_t end, const uint8_t* received) {
    if (input == work) {
      const void* inputs[] = {work + begin * element, received};
      void* outputs[] = {work + begin * element};
      kernels::reduce_to_all(dtype, op, inputs, 2, outputs, 1, end - begin, false);
    } else {
      operand.reduce_into(op, begin, end, received);
    }
  };
  Flight flight(links, &step.scratch, operand.memory(), "running a halving-doubling allreduce");
  const uint64_t all_bytes = count * element;
  if (me < 2 * extra && me % 2 == 0) {
    // Sits out: hand the data to the odd partner, get the result back.
    flight.add(links.send(me + 1, tag(me, 0), input, all_bytes));
    flight.add(links.receive(tag(me + 1, fold_back), me + 1, work, all_bytes));
    if (auto error = co_await flight.wait_all()) co_return error;
    operand.deliver(0, count);
    co_return std::nullopt;
  }
  uint8_t* incoming = step.scratch.get(0, std::max<uint64_t>(all_bytes, 1));
  if (me < 2 * extra) {
    const size_t fold = flight.add(links.receive(tag(me - 1, 0), me - 1, incoming, all_bytes));
    if (auto error = co_await flight.wait(fold)) co_return error;
    reduce_received(0, count, incoming);
    input = work;
  }
  const uint32_t virtual_rank = me < 2 * extra ? me / 2 : me - extra;
  auto real_node = [extra](uint32_t v) { return v < extra ? 2 * v + 1 : v + extra; };

  // Halving: keep one half of the current range, send the other to the partner.
  uint64_t begin = 0;
  uint64_t end = count;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // before each level, for the way back
  for (uint32_t level = 0; level < levels; ++level) {
    const uint32_t mask = p >> (level + 1);
    const uint32_t partner = real_node(virtual_rank ^ mask);
    ranges.emplace_back(begin, end);
    const uint64_t middle = begin + (end - begin) / 2;
    const bool lower = (virtual_rank & mask) == 0;
    const uint64_t keep_begin = lower ? begin : middle;
    const uint64_t keep_end = lower ? middle : end;
    const uint64_t give_begin = lower ? middle : begin;
    const uint64_t give_end = lower ? end : middle;
    const size_t receive = flight.add(links.receive(tag(partner, 1 + level), partner, incoming,
                                                    (keep_end - keep_begin) * element));
    flight.add(links.send(partner, tag(me, 1 + level), input + give_begin * element,
                          (give_end - give_begin) * element));
    if (auto error = co_await flight.wait(receive)) co_return error;
    reduce_received(keep_begin, keep_end, incoming);
    input = work;
    // The next receive reuses `incoming`; the send just posted reads the input or `work`, which
    // the next level does not write outside the kept half.
    begin = keep_begin;
    end = keep_end;
  }
  if (operand.op() == GRADSYNC_AVG) {
    kernels::divide(dtype, work + begin * element, end - begin,
                    static_cast<uint64_t>(step.world_size));
  }
  // Doubling: the same partners backwards; each sends what it has and receives the other half.
  for (uint32_t level = levels; level-- > 0;) {
    const uint32_t mask = p >> (level + 1);
    const uint32_t partner = real_node(virtual_rank ^ mask);
    const auto [outer_begin, outer_end] = ranges[level];
    const bool lower = (virtual_rank & mask) == 0;
    const uint64_t other_begin = lower ? end : outer_begin;
    const uint64_t other_end = lower ? outer_end : begin;
    const size_t receive = flight.add(links.receive(tag(partner, 2 * levels - level), partner,
                                                    work + other_begin * element,
                                                    (other_end - other_begin) * element));
    flight.add(links.send(partner, tag(me, 2 * levels - level), work + begin * element,
                          (end - begin) * element));
    if (auto error = co_await flight.wait(receive)) co_return error;
    begin = outer_begin;
    end = outer_end;
  }
  if (me < 2 * extra) flight.add(links.send(me - 1, tag(me, fold_back), work, all_bytes));
  operand.deliver(0, count);
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
