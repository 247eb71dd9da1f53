// Allreduce through the job's aggregators (docs/aggregators.md; PHub, BytePS's summation
// service): each node pushes its ranks' sum of every chunk to the chunk's aggregator once, and
// receives the sum over every node once, so a node's link carries the data once each way where
// the ring carries it 2(n-1)/n times. The aggregators sum a chunk as soon as its last push is
// in and send it straight back, so chunks stream: the first sums return while later chunks are
// still being pushed.
//
// Every node gets the same sum from the aggregator, so every rank ends with the same bits. With
// the bf16 wire codec (f32 only), pushes and sums travel as bf16 and the aggregator sums in f32.
#include "daemon/collectives/internode/node_collectives.h"
#include "daemon/links/aggregation.capnp.h"
#include "daemon/links/aggregation_plan.h"
#include "kernels/codec.h"
#include "kernels/reduce.h"

#include <capnp/message.h>
#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace gradsync::daemon {
namespace {

// Scratch slots (node_collectives.h): the bf16 image of the work, pushes leaving from it and
// sums landing in it.
constexpr size_t kWireSlot = 9;

// Tells aggregator `a` what this node pushes of the collective: it posts the receives for the
// pushes once it knows their sizes (aggregation.capnp). Sent before the pushes on the same
// connection, so it arrives first.
void announce(const CollectiveContext& step, uint32_t a, gradsync_dtype dtype, gradsync_op op,
              uint64_t count, bool bf16) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<wire::AggregationMessage>();
  root.setJob(step.links.job_name());
  root.setNode(step.links.me());
  root.setIncarnation(step.links.incarnation());
  auto batch = root.initBatch();
  batch.setSequence(step.sequence & 0xffffu);
  batch.setDtype(static_cast<uint8_t>(dtype));
  batch.setOp(static_cast<uint8_t>(op));
  batch.setCount(count);
  batch.setBf16(bf16);
  step.links.send_to_aggregator(a, message);
}

}  // namespace

NodeTask node_aggregate_allreduce(CollectiveContext& step, const AllreduceOperand& operand) {
  NodeLinks& links = step.links;
  const uint32_t aggregators = links.aggregators();
  if (aggregators == 0) co_return fmt::format("job '{}' has no aggregators", links.job_name());
  // Fused in place only for halving-doubling (NodeJob::fusion_layout): one block here.
  if (operand.max_blocks() != 1) {
    co_return fmt::format("job '{}': aggregation needs its work in one block", links.job_name());
  }
  const uint64_t count = operand.count();
  const size_t element = operand.element_bytes();
  const gradsync_op op = node_detail::network_op(operand.op());
  const bool bf16 =
      step.codec == cost_model::WireCodec::kBf16 && operand.dtype() == GRADSYNC_FLOAT32;
  const size_t travelling = bf16 ? sizeof(uint16_t) : element;
  // The aggregators see the collective's number as its tags carry it: 16 bits.
  const AggregationPlan plan(count, travelling, step.aggregation_chunk_bytes, aggregators,
                             step.sequence & 0xffffu);
  if (!plan.fits_tags()) {
    co_return fmt::format("job '{}': '{}' has {} chunks of {} bytes, more than {} per aggregator",
                          links.job_name(), operand.name(), plan.chunks(),
                          step.aggregation_chunk_bytes, aggregation::kMaxLocalChunks);
  }
  uint8_t* work = operand.work();
  auto* wire =
      bf16 ? reinterpret_cast<uint16_t*>(step.scratch.get(kWireSlot, count * sizeof(uint16_t)))
           : nullptr;
  // Where chunk elements [begin, end) travel from and land: the work, or its bf16 image.
  auto travelling_at = [&](uint64_t begin) {
    return bf16 ? reinterpret_cast<uint8_t*>(wire + begin) : work + begin * element;
  };
  for (uint32_t a = 0; a < aggregators; ++a) {
    if (plan.chunks_of(a) > 0) announce(step, a, operand.dtype(), op, count, bf16);
  }
  Flight flight(links, &step.scratch, operand.memory(), "running an allreduce through aggregators");
  // Every sum's receive is posted before any push leaves, so that no sum arrives unexpected
  // (UCX would buffer it). A sum lands where its push left from: the aggregator sends it only
  // once every push of the chunk, this node's included, has arrived whole, so the push no
  // longer reads that memory.
  const uint64_t chunks = plan.chunks();
  std::vector<size_t> sums(chunks);
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t begin = plan.begin(c);
    const uint64_t bytes = (plan.end(c) - begin) * travelling;
    sums[c] = flight.add(links.receive_sum(plan.aggregator_of(c), step.sequence,
                                           plan.local_index(c), travelling_at(begin), bytes));
  }
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t begin = plan.begin(c);
    const uint64_t end = plan.end(c);
    const uint8_t* from = bf16 ? nullptr : operand.sole_input(begin, end);
    if (from == nullptr) {
      operand.reduce_into(op, begin, end, nullptr);
      from = work + begin * element;
    }
    if (bf16) {
      kernels::encode_bf16(wire + begin, reinterpret_cast<const float*>(from), end - begin);
      from = travelling_at(begin);
    }
    const uint64_t bytes = (end - begin) * travelling;
    co_await step.pace(bytes);
    flight.add(links.push(plan.aggregator_of(c), step.sequence, plan.local_index(c), from, bytes));
  }
  for (uint64_t c = 0; c < chunks; ++c) {
    if (auto error = co_await flight.wait(sums[c])) co_return error;
    const uint64_t begin = plan.begin(c);
    const uint64_t end = plan.end(c);
    if (bf16) {
      kernels::decode_bf16(reinterpret_cast<float*>(work) + begin, wire + begin, end - begin);
    }
    if (operand.op() == GRADSYNC_AVG) {
      kernels::divide(operand.dtype(), work + begin * element, end - begin,
                      static_cast<uint64_t>(step.world_size));
    }
    operand.deliver(begin, end);
  }
  co_return co_await flight.wait_all();
}

NodeTask node_split_allreduce(CollectiveContext& step, const AllreduceOperand& operand) {
  // Whole chunks through the aggregators, from the front; the rest by the ring, at the same
  // time. Each part's own tags and scratch slots keep the two apart.
  const uint64_t chunk_elements =
      std::max<uint64_t>(1, step.aggregation_chunk_bytes / operand.element_bytes());
  const auto wanted =
      static_cast<uint64_t>(step.aggregated_share * static_cast<double>(operand.count()));
  const uint64_t split =
      std::min(operand.count(), (wanted + chunk_elements - 1) / chunk_elements * chunk_elements);
  if (split == 0 || split == operand.count()) {
    NodeTask whole =
        split == 0 ? node_ring_allreduce(step, operand) : node_aggregate_allreduce(step, operand);
    co_return co_await finish(whole);
  }
  const AllreduceOperand aggregated = operand.slice(0, split);
  const AllreduceOperand ringed = operand.slice(split, operand.count());
  // Scratch of its own: a part that fails hands its scratch to the transport while the
  // other's operations may still write into theirs.
  Scratch scratch;
  CollectiveContext aggregation_step{
      step.links,           scratch,          step.sequence,
      step.world_size,      step.codec,       step.max_message_bytes,
      step.ranked,          step.piece_bytes, step.aggregation_chunk_bytes,
      step.aggregated_share};
  NodeTask through_aggregators = node_aggregate_allreduce(aggregation_step, aggregated);
  NodeTask by_ring = node_ring_allreduce(step, ringed);
  co_return co_await finish_both(through_aggregators, by_ring);
}

}  // namespace gradsync::daemon
