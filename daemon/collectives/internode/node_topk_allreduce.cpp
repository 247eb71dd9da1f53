// Top-k chunk sparsification with error feedback around the allreduce across nodes
// (GradientFlow's coarse-grained sparse communication; kernels/sparse.h). For a sum or an
// average of f32 gradients, with the job's wire codec set to topk:
//  1. each node adds its local ranks' inputs (their sum) to what it held back of each tensor
//     last time, in the buffer that holds it back, and measures each chunk's energy;
//  2. the energies are summed across the nodes (an allreduce of one float per chunk), so that
//     every node holds the same figures, to the bit, and chooses the same chunks;
//  3. each tensor sends its `percent` of chunks with the most energy (at least one), packed
//     end to end, in one allreduce; what it does not send stays where it is, for its next
//     allreduce (Residuals);
//  4. the result is the sum (or average) over the nodes of the chosen chunks, and zero in the
//     others, delivered to the local ranks as any allreduce's.
// Each tensor is chunked and chosen on its own, so what it sends does not depend on what it was
// fused with. The two allreduces are collectives `sequence` and `sequence + 1` of the job.
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/sparse.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gradsync::daemon {
namespace {

// A scratch buffer of floats as the one rank of an allreduce: its own input and output.
ReadyCollective scratch_allreduce(const std::string& name, float* data, uint64_t count,
                                  gradsync_op op) {
  ReadyCollective collective;
  Submission& s = collective.ranks.emplace_back();
  s.name = name;
  s.collective = ipc::Collective::kAllreduce;
  s.dtype = GRADSYNC_FLOAT32;
  s.op = op;
  s.count = count;
  s.send = reinterpret_cast<const uint8_t*>(data);
  s.recv = reinterpret_cast<uint8_t*>(data);
  return collective;
}

// One tensor of the work, and where its chunks lie among the batch's.
struct Tensor {
  const ReadyCollective* collective;
  uint64_t from;  // its first element in the work
  uint64_t first_chunk;
  uint64_t chunks;
  uint64_t first_chosen;  // in the batch's list of chosen chunks
  uint64_t chosen;
  bool carries;  // false for a second tensor of the same name in one batch: nothing kept

  const std::string& name() const { return collective->first().name; }
  uint64_t count() const { return collective->first().count; }
};

// Scratch slots beside the algorithms' (node_collectives.h).
constexpr size_t kEnergySlot = 5;
constexpr size_t kPackedSlot = 6;
constexpr size_t kChosenSlot = 7;
constexpr size_t kOrderSlot = 8;

}  // namespace

NodeTask node_topk_allreduce(CollectiveContext& step, const AllreduceOperand& operand,
                             TopKRun topk) {
  constexpr uint64_t kChunk = cost_model::kTopKChunkElements;
  std::vector<Tensor> tensors;
  std::vector<const std::string*> names;
  uint64_t chunks = 0;
  uint64_t chosen_chunks = 0;
  uint64_t largest = 0;  // the most chunks of one tensor
  operand.for_each_tensor([&](const ReadyCollective& collective, uint64_t from) {
    const Submission& lead = collective.first();
    const uint64_t tensor_chunks = (lead.count + kChunk - 1) / kChunk;
    const auto wanted =
        static_cast<uint64_t>(std::ceil(static_cast<double>(tensor_chunks) * topk.percent / 100.0));
    const uint64_t chosen =
        std::clamp<uint64_t>(wanted, std::min<uint64_t>(1, tensor_chunks), tensor_chunks);
    const bool repeated = std::any_of(names.begin(), names.end(),
                                      [&lead](const std::string* n) { return *n == lead.name; });
    tensors.push_back({&collective, from, chunks, tensor_chunks, chosen_chunks, chosen, !repeated});
    if (!repeated) names.push_back(&lead.name);
    chunks += tensor_chunks;
    chosen_chunks += chosen;
    largest = std::max(largest, tensor_chunks);
  });
  if (chunks == 0) co_return std::nullopt;  // every node has the same (agreed) sizes
  // The next step's allreduce of a tensor may start while this one runs: it waits here until
  // this one has given back what it held back.
  co_await NodeAwait<ResidualsWait>{ResidualsWait(topk.residuals, names)};
  std::vector<std::vector<float>> carried(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    carried[t] = tensors[t].carries ? topk.residuals.take(tensors[t].name(), tensors[t].count())
                                    : std::vector<float>(tensors[t].count(), 0.0f);
  }
  auto work_of = [&operand](const Tensor& t) {
    return reinterpret_cast<float*>(operand.at(t.from, t.from + t.count()));
  };

  // 1. The local ranks' inputs added to what this node held back, in the held-back buffer
  // (what is not sent stays there, with no copy), and each chunk's energy: one pass, the
  // inputs read where they lie.
  auto* energy = reinterpret_cast<float*>(step.scratch.get(kEnergySlot, chunks * sizeof(float)));
  std::vector<const float*> inputs;
  for (size_t t = 0; t < tensors.size(); ++t) {
    inputs.clear();
    for (const Submission& rank : tensors[t].collective->ranks) {
      inputs.push_back(reinterpret_cast<const float*>(rank.send));
    }
    kernels::carry_and_measure(carried[t].data(), inputs, tensors[t].count(), kChunk,
                               energy + tensors[t].first_chunk);
  }

  // 2. The energies summed over the nodes.
  CollectiveContext inner{step.links,
                          step.scratch,
                          step.sequence,
                          step.world_size,
                          cost_model::WireCodec::kNone,
                          step.max_message_bytes};
  {
    const ReadyCollective sums = scratch_allreduce(operand.name(), energy, chunks, GRADSYNC_SUM);
    const AllreduceOperand summed(sums);
    NodeTask task = run_allreduce(inner, summed, topk.choose(chunks * sizeof(float)));
    if (auto error = co_await finish(task)) co_return error;
  }

  // 3. The chunks each tensor sends, packed and cleared from what it keeps.
  auto* chosen =
      reinterpret_cast<uint32_t*>(step.scratch.get(kChosenSlot, chosen_chunks * sizeof(uint32_t)));
  auto* order =
      reinterpret_cast<uint32_t*>(step.scratch.get(kOrderSlot, largest * sizeof(uint32_t)));
  uint64_t packed_count = 0;
  for (const Tensor& t : tensors) {
    kernels::choose_chunks(std::span(energy + t.first_chunk, t.chunks),
                           std::span(chosen + t.first_chosen, t.chosen),
                           std::span(order, t.chunks));
    for (uint64_t c = 0; c < t.chosen; ++c) {
      const uint64_t begin = chosen[t.first_chosen + c] * kChunk;
      packed_count += std::min(t.count(), begin + kChunk) - begin;
    }
  }
  auto* packed =
      reinterpret_cast<float*>(step.scratch.get(kPackedSlot, packed_count * sizeof(float)));
  {
    float* to = packed;
    for (size_t t = 0; t < tensors.size(); ++t) {
      float* kept = carried[t].data();
      for (uint64_t c = 0; c < tensors[t].chosen; ++c) {
        const uint64_t begin = chosen[tensors[t].first_chosen + c] * kChunk;
        const uint64_t elements = std::min(tensors[t].count(), begin + kChunk) - begin;
        std::memcpy(to, kept + begin, elements * sizeof(float));
        std::memset(kept + begin, 0, elements * sizeof(float));
        to += elements;
      }
    }
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].carries) topk.residuals.give_back(tensors[t].name(), std::move(carried[t]));
  }

  // 4. The chosen chunks across the nodes (an average divides there), then into place.
  inner.sequence = step.sequence + 1;
  {
    const ReadyCollective sent =
        scratch_allreduce(operand.name(), packed, packed_count, operand.op());
    const AllreduceOperand reduced(sent);
    NodeTask task = run_allreduce(inner, reduced, topk.choose(packed_count * sizeof(float)));
    if (auto error = co_await finish(task)) co_return error;
  }
  // The result: the chosen chunks' sums, zeros between them.
  const float* from = packed;
  for (const Tensor& t : tensors) {
    float* work = work_of(t);
    uint64_t done = 0;  // elements of the tensor written
    for (uint64_t c = 0; c < t.chosen; ++c) {
      const uint64_t begin = chosen[t.first_chosen + c] * kChunk;
      const uint64_t elements = std::min(t.count(), begin + kChunk) - begin;
      std::memset(work + done, 0, (begin - done) * sizeof(float));
      std::memcpy(work + begin, from, elements * sizeof(float));
      from += elements;
      done = begin + elements;
    }
    std::memset(work + done, 0, (t.count() - done) * sizeof(float));
  }
  operand.deliver(0, operand.count());
  co_return std::nullopt;
}
}  // namespace gradsync::daemon
