#include "daemon/aggregator/aggregator_job.h"

#include "daemon/links/links.h"
#include "ipc/protocol.h"
#include "kernels/codec.h"
#include "kernels/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace gradsync::daemon {
namespace {

// A job's collectives in flight here at once, and the bytes of one: bounds on the memory a
// job's nodes can make an aggregator hold (each collective's pushes are held side by side).
constexpr size_t kMaxBatches = 256;
constexpr uint64_t kMaxBatchBytes = uint64_t{16} << 30;
// Buffers kept for the next collectives of the job.
constexpr size_t kMaxSpareBuffers = 8;

}  // namespace

AggregatorJob::AggregatorJob(Shape shape, transport::Transport& transport)
    : shape_(std::move(shape)), transport_(transport), incarnations_(shape_.nodes.size(), 0) {}

AggregatorJob::~AggregatorJob() {
  for (auto& [sequence, batch] : batches_) release(batch);
}

std::optional<std::string> AggregatorJob::announce(uint32_t node,
                                                   wire::AggregationBatch::Reader announced,
                                                   Clock::time_point now) {
  const uint32_t sequence = announced.getSequence() & 0xffffu;
  const auto dtype = ipc::parse_dtype(announced.getDtype());
  const auto op = ipc::parse_op(announced.getOp());
  const uint64_t count = announced.getCount();
  const bool bf16 = announced.getBf16();
  if (!dtype || !op || *op == GRADSYNC_AVG || !ipc::op_reduces(*op, *dtype) || count == 0 ||
      (bf16 && *dtype != GRADSYNC_FLOAT32)) {
    return fmt::format(
        "node {} announced collective {} with dtype {}, op {}, {} elements{}: not "
        "a sum this aggregator can take",
        node, sequence, announced.getDtype(), announced.getOp(), count, bf16 ? " as bf16" : "");
  }
  const size_t travelling = bf16 ? sizeof(uint16_t) : ipc::dtype_bytes(*dtype);
  if (count > kMaxBatchBytes / travelling) {
    return fmt::format("node {} announced collective {} of {} elements: more than {} bytes", node,
                       sequence, count, kMaxBatchBytes);
  }
  const AggregationPlan plan(count, travelling, shape_.chunk_bytes, shape_.aggregators, sequence);
  const uint64_t chunks = plan.chunks_of(shape_.index);
  if (!plan.fits_tags() || chunks == 0) {
    return fmt::format(
        "node {} announced collective {} of {} elements, of which this aggregator "
        "({} of {}) sums {} chunks",
        node, sequence, count, shape_.index, shape_.aggregators, chunks);
  }
  auto [it, created] = batches_.try_emplace(sequence);
  Batch& batch = it->second;
  if (created) {
    if (batches_.size() > kMaxBatches) {
      batches_.erase(it);
      return fmt::format("node {} has more than {} collectives in flight here", node, kMaxBatches);
    }
    batch.sequence = sequence;
    batch.dtype = *dtype;
    batch.op = *op;
    batch.count = count;
    batch.bf16 = bf16;
    batch.travelling = travelling;
    batch.chunks = chunks;
    batch.offsets.push_back(0);
    for (uint64_t local = 0; local < chunks; ++local) {
      const uint64_t chunk = plan.chunk(shape_.index, local);
      batch.offsets.push_back(batch.offsets.back() +
                              (plan.end(chunk) - plan.begin(chunk)) * travelling);
    }
    const size_t nodes = shape_.nodes.size();
    batch.announced.assign(nodes, false);
    batch.arrivals = buffer(nodes * batch.offsets.back());
    batch.sums = buffer(batch.offsets.back());
    batch.pushes.resize(nodes * chunks);
    batch.pushed.assign(nodes * chunks, false);
    batch.arrived.assign(chunks, 0);
    batch.first_push.resize(chunks);
    batch.sent.assign(chunks, 0);
  } else if (batch.dtype != *dtype || batch.op != *op || batch.count != count ||
             batch.bf16 != bf16) {
    return fmt::format(
        "node {} announced collective {} as {} {} of {} elements{}; another node "
        "as {} {} of {}{}",
        node, sequence, ipc::dtype_name(*dtype), ipc::op_name(*op), count, bf16 ? " (bf16)" : "",
        ipc::dtype_name(batch.dtype), ipc::op_name(batch.op), batch.count,
        batch.bf16 ? " (bf16)" : "");
  } else if (batch.announced[node]) {
    return fmt::format("node {} announced collective {} twice", node, sequence);
  }
  batch.last_moved = now;
  return start(batch, node);
}

std::optional<std::string> AggregatorJob::start(Batch& batch, uint32_t node) {
  batch.announced[node] = true;
  const uint64_t share = batch.offsets.back();
  uint8_t* arrivals = batch.arrivals->data() + node * share;
  for (uint64_t chunk = 0; chunk < batch.chunks; ++chunk) {
    const uint64_t tag =
        tags::make(tags::kPush, node, shape_.tag, tags::low(batch.sequence, chunk));
    batch.pushes[node * batch.chunks + chunk] =
        transport_.receive(tag, tags::kAll, arrivals + batch.offsets[chunk],
                           batch.offsets[chunk + 1] - batch.offsets[chunk], shape_.peers[node], 0);
  }
  return std::nullopt;
}

AggregatorJob::Progress AggregatorJob::progress(Clock::time_point now,
                                                std::chrono::seconds timeout) {
  Progress result;
  const auto nodes = static_cast<uint32_t>(shape_.nodes.size());
  for (auto it = batches_.begin(); it != batches_.end();) {
    Batch& batch = it->second;
    for (uint32_t node = 0; node < nodes; ++node) {
      if (!batch.announced[node]) continue;
      for (uint64_t chunk = 0; chunk < batch.chunks; ++chunk) {
        const size_t i = node * batch.chunks + chunk;
        if (batch.pushed[i] || !batch.pushes[i].done()) continue;
        const uint64_t expected = batch.offsets[chunk + 1] - batch.offsets[chunk];
        const transport::Operation& push = batch.pushes[i];
        if (push.status() != UCS_OK || push.received_bytes() != expected) {
          result.error = fmt::format(
              "node {}'s push of chunk {} of collective {} {}: it was announced as {} bytes", node,
              chunk, batch.sequence,
              push.status() == UCS_OK
                  ? fmt::format("brought {} bytes", push.received_bytes())
                  : fmt::format("failed ({})", ucs_status_string(push.status())),
              expected);
          return result;
        }
        batch.pushed[i] = true;
        bytes_received_ += expected;
        if (batch.arrived[chunk]++ == 0) batch.first_push[chunk] = now;
        batch.last_moved = now;
        result.moved = true;
        if (batch.arrived[chunk] == nodes) {
          sum(batch, chunk);
          chunk_waits_.push_back(
              std::chrono::duration<double>(now - batch.first_push[chunk]).count());
        }
      }
    }
    // Sums not sent yet: a node that had not accepted this aggregator's connection when its
    // sum was ready gets it now.
    bool sent_all = true;
    for (uint64_t chunk = 0; chunk < batch.chunks; ++chunk) {
      if (batch.arrived[chunk] == nodes && batch.sent[chunk] < nodes) {
        send_sum(batch, chunk);
        result.moved = true;
      }
      sent_all = sent_all && batch.sent[chunk] == nodes;
    }
    const bool done = sent_all && std::all_of(batch.sends.begin(), batch.sends.end(),
                                              [](const auto& send) { return send.done(); });
    if (done) {
      release(batch);
      it = batches_.erase(it);
      result.moved = true;
      continue;
    }
    if (!sent_all && now - batch.last_moved > timeout) {
      std::string missing;
      for (uint32_t node = 0; node < nodes; ++node) {
        const bool waiting =
            !batch.announced[node] || std::any_of(batch.pushed.begin() + node * batch.chunks,
                                                  batch.pushed.begin() + (node + 1) * batch.chunks,
                                                  [](bool p) { return !p; });
        if (waiting) missing += fmt::format("{}node {}", missing.empty() ? "" : ", ", node);
      }
      result.error = fmt::format("no push of collective {} came from {} for {} s", batch.sequence,
                                 missing, timeout.count());
      return result;
    }
    ++it;
  }
  return result;
}

void AggregatorJob::sum(Batch& batch, uint64_t chunk) {
  const auto nodes = static_cast<uint32_t>(shape_.nodes.size());
  const uint64_t share = batch.offsets.back();
  const uint64_t offset = batch.offsets[chunk];
  const uint64_t elements = (batch.offsets[chunk + 1] - offset) / batch.travelling;
  const uint8_t* arrivals = batch.arrivals->data() + offset;
  uint8_t* out = batch.sums->data() + offset;
  // Every node's push added in node order: the same sum whatever order they arrived in.
  if (!batch.bf16) {
    std::array<const void*, kMaxNodes> inputs{};
    for (uint32_t node = 0; node < nodes; ++node) inputs[node] = arrivals + node * share;
    void* outputs[] = {out};
    kernels::reduce_to_all(batch.dtype, batch.op, inputs.data(), nodes, outputs, 1, elements,
                           false);
  } else {
    // In f32, one push decoded beside the running sum, both in a buffer that stays in cache.
    decoded_.resize(2 * elements);
    float* total = decoded_.data();
    float* next = total + elements;
    kernels::decode_bf16(total, reinterpret_cast<const uint16_t*>(arrivals), elements);
    for (uint32_t node = 1; node < nodes; ++node) {
      kernels::decode_bf16(next, reinterpret_cast<const uint16_t*>(arrivals + node * share),
                           elements);
      const void* inputs[] = {total, next};
      void* outputs[] = {total};
      kernels::reduce_to_all(GRADSYNC_FLOAT32, batch.op, inputs, 2, outputs, 1, elements, false);
    }
    kernels::encode_bf16(reinterpret_cast<uint16_t*>(out), total, elements);
  }
  ++batch.chunks_summed;
  ++chunks_summed_;
  send_sum(batch, chunk);
}

void AggregatorJob::send_sum(Batch& batch, uint64_t chunk) {
  const uint64_t offset = batch.offsets[chunk];
  const uint64_t bytes = batch.offsets[chunk + 1] - offset;
  const uint64_t tag =
      tags::make(tags::kSum, shape_.index, shape_.tag, tags::low(batch.sequence, chunk));
  // In node order: a node whose connection is not accepted yet holds back the ones after it.
  while (batch.sent[chunk] < shape_.nodes.size()) {
    const transport::PeerId peer = shape_.peers[batch.sent[chunk]];
    if (!transport_.authenticated(peer) && !transport_.failed(peer)) return;
    batch.sends.push_back(transport_.send(peer, tag, batch.sums->data() + offset, bytes, 0));
    bytes_sent_ += bytes;
    ++batch.sent[chunk];
  }
}

uint64_t AggregatorJob::pushes_waiting() const {
  uint64_t waiting = 0;
  for (const auto& [sequence, batch] : batches_) {
    for (size_t node = 0; node < batch.announced.size(); ++node) {
      if (!batch.announced[node]) continue;
      waiting += static_cast<uint64_t>(std::count(
          batch.pushed.begin() + static_cast<ptrdiff_t>(node * batch.chunks),
          batch.pushed.begin() + static_cast<ptrdiff_t>((node + 1) * batch.chunks), false));
    }
  }
  return waiting;
}

std::shared_ptr<std::vector<uint8_t>> AggregatorJob::buffer(size_t bytes) {
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if ((*it)->size() >= bytes && (best == spare_.end() || (*it)->size() < (*best)->size())) {
      best = it;
    }
  }
  if (best != spare_.end()) {
    auto found = std::move(*best);
    spare_.erase(best);
    return found;
  }
  return std::make_shared<std::vector<uint8_t>>(bytes);
}

void AggregatorJob::release(Batch& batch) {
  std::vector<transport::Operation> pending;
  for (auto& push : batch.pushes) {
    if (push.valid() && !push.done()) pending.push_back(std::move(push));
  }
  for (auto& send : batch.sends) {
    if (send.valid() && !send.done()) pending.push_back(std::move(send));
  }
  if (!pending.empty()) {
    // UCX may still write the pushes' memory and read the sums': the transport keeps both
    // until it is done with them.
    transport_.retire(std::move(pending), {batch.arrivals, batch.sums});
    return;
  }
  for (auto* kept : {&batch.arrivals, &batch.sums}) {
    if (*kept && kept->use_count() == 1 && spare_.size() < kMaxSpareBuffers) {
      spare_.push_back(std::move(*kept));
    }
  }
}

}  // namespace gradsync::daemon
