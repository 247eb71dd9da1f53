// Ring allreduce across nodes: a reduce-scatter then an allgather, 2(n-1) steps that each move
// 1/n of the data to the right-hand neighbour (bandwidth-optimal: every node sends and
// receives 2(n-1)/n of the data, whatever n is).
//
// Pipelined: each step's slice is cut into pieces that travel independently. A piece is
// reduced the moment it arrives, together with the local ranks' inputs for it (so the local
// reduce costs no pass of its own), and sent straight on, while later pieces are still on the
// wire. In the allgather, each finished piece is forwarded first and copied to the other local
// ranks while it travels.
//
// With the bf16 wire codec (f32 only), every piece travels as bf16 and is reduced in f32 where
// it lands. The node that finishes a chunk rounds it once and keeps the rounded values itself,
// and the allgather forwards the bytes it received without decoding and encoding them again:
// every node ends with the same bits.
#include "cost_model/cost_model.h"
#include "daemon/collectives/internode/node_collectives.h"
#include "kernels/codec.h"
#include "kernels/reduce.h"

#include <algorithm>
#include <array>

namespace gradsync::daemon {
namespace {

// Pieces per step: enough that a piece stays at kPipelinePieceBytes up to 256 MiB of a node's
// share (with eager bulk data, a piece that arrives before its receive is posted is buffered
// whole by UCX, so pieces should not grow without bound). A piece's tag part counts steps
// times pieces in 16 bits.
constexpr uint64_t kMaxPiecesPerStep = 64;
static_assert(uint64_t{2} * (kMaxNodes - 1) * kMaxPiecesPerStep <= 0x10000,
              "pieces overflow the tag's part");

// This node's own chunk goes out at most this many pieces ahead of the first one not yet
// delivered. Their receives are posted when the collective starts, so the rest follow as those
// land; and a collective of higher priority that starts meanwhile waits for these few pieces,
// not for the whole chunk (docs/priority.md). Two keep the link busy while one is finishing.
constexpr uint32_t kOwnPiecesAhead = 2;

struct Range {
  uint64_t begin;
  uint64_t end;
};

// Where the ring's pieces leave from and land, with or without the codec. Without it, a piece
// is sent from the work buffer and an allgather piece lands in place. With it, `wire` holds
// the bf16 image of the work buffer (element i at wire[i]): pieces are encoded into it before
// they leave, and allgather pieces land in it and are decoded into place. Each codec pass runs
// beside the pass that produces or consumes its values, a cache-sized block at a time, so that
// the codec adds compute and no memory traffic of its own.
class RingWire {
 public:
  RingWire(const AllreduceOperand& operand, Scratch& scratch, cost_model::WireCodec codec)
      : work_(operand.work()),
        element_(operand.element_bytes()),
        bf16_(codec == cost_model::WireCodec::kBf16 && operand.dtype() == GRADSYNC_FLOAT32),
        wire_(bf16_ ? reinterpret_cast<uint16_t*>(
                          scratch.get(kWireSlot, operand.count() * sizeof(uint16_t)))
                    : nullptr),
        decoded_(
            bf16_ ? reinterpret_cast<float*>(scratch.get(kDecodedSlot, kCodecBlock * sizeof(float)))
                  : nullptr) {}

  // Where the reduce-scatter's pieces arrive, as they travel: two slots of `elements`,
  // alternating by step.
  std::array<uint8_t*, 2> arrival_slots(Scratch& scratch, uint64_t elements) const {
    const uint64_t bytes = elements * travelling_element();
    return {scratch.get(0, bytes), scratch.get(1, bytes)};
  }
  // Where in an arrival slot the element `offset` of its chunk lands.
  uint8_t* arrival(uint8_t* slot, uint64_t offset) const {
    return slot + offset * travelling_element();
  }
  uint64_t bytes(Range r) const { return (r.end - r.begin) * travelling_element(); }

  // This node's own contribution to chunk piece r, to send at the reduce-scatter's first
  // step. A lone local rank's input leaves as it is (or is encoded from where it is): work[r]
  // is written next by the allgather, so a copy into it first would be a pass for nothing.
  const uint8_t* first_outgoing(const AllreduceOperand& operand, gradsync_op op, Range r) const {
    const uint8_t* input = operand.sole_input(r.begin, r.end);
    if (!bf16_) {
      if (input != nullptr) return input;
      operand.reduce_into(op, r.begin, r.end, nullptr);
      return travelling(r);
    }
    for_each_codec_block(r, [&](Range b) {
      if (input == nullptr) operand.reduce_into(op, b.begin, b.end, nullptr);
      const auto* values =
          input != nullptr ? reinterpret_cast<const float*>(input) + (b.begin - r.begin) : work(b);
      kernels::encode_bf16(wire_ + b.begin, values, b.end - b.begin);
    });
    return travelling(r);
  }
  // work[r] = `op` over the local inputs and the piece that arrived at `received`. With the
  // codec, the piece is decoded a block at a time into a buffer that stays in cache, and with
  // `forward` each reduced block is encoded for the next step while it is still there.
  void reduce_arrived(const AllreduceOperand& operand, gradsync_op op, Range r,
                      const uint8_t* received, bool forward) const {
    if (!bf16_) {
      operand.reduce_into(op, r.begin, r.end, received);
      return;
    }
    const auto* encoded = reinterpret_cast<const uint16_t*>(received);
    for_each_codec_block(r, [&](Range b) {
      kernels::decode_bf16(decoded_, encoded + (b.begin - r.begin), b.end - b.begin);
      operand.reduce_into(op, b.begin, b.end, reinterpret_cast<const uint8_t*>(decoded_));
      if (forward) kernels::encode_bf16(wire_ + b.begin, work(b), b.end - b.begin);
    });
  }
  // A finished piece of this node's chunk, before it is delivered and sent: with the codec,
  // rounded in place to what the other nodes will decode, beside its wire image.
  void finish(Range r) const {
    if (bf16_) kernels::round_bf16(wire_ + r.begin, work(r), r.end - r.begin);
  }
  // The bytes of work[r] as they travel: where a piece leaves from once reduce_arrived
  // (forward), finish or first_outgoing made it, and where an allgather piece lands.
  uint8_t* travelling(Range r) const {
    return bf16_ ? reinterpret_cast<uint8_t*>(wire_ + r.begin) : work_ + r.begin * element_;
  }
  // An allgather piece landed: decoded into place.
  void landed(Range r) const {
    if (bf16_) kernels::decode_bf16(work(r), wire_ + r.begin, r.end - r.begin);
  }

 private:
  // Scratch slots 0 and 1 are the reduce-scatter's, 2 the fusion buffer's (node_collectives.h).
  static constexpr size_t kWireSlot = 3;
  static constexpr size_t kDecodedSlot = 4;
  // Elements per codec block: 256 KiB of f32, which stays in a core's L2 cache between the
  // pass that writes it and the one that reads it (2 namespace nodes, 64 MiB: 16 Ki elements
  // gained as much with one local rank and nothing with two, where the reduce reads three
  // streams and a shorter block restarts the prefetchers more often).
  static constexpr uint64_t kCodecBlock = 64 << 10;

  size_t travelling_element() const { return bf16_ ? sizeof(uint16_t) : element_; }
  float* work(Range r) const { return reinterpret_cast<float*>(work_) + r.begin; }
  template <typename Fn>
  static void for_each_codec_block(Range r, Fn&& fn) {
    for (uint64_t begin = r.begin; begin < r.end; begin += kCodecBlock) {
      fn(Range{begin, std::min(r.end, begin + kCodecBlock)});
    }
  }

  uint8_t* work_;
  size_t element_;
  bool bf16_;
  uint16_t* wire_;
  float* decoded_;
};

}  // namespace

NodeTask node_ring_allreduce(CollectiveContext& step, const AllreduceOperand& operand) {
  NodeLinks& links = step.links;
  const uint32_t n = links.nodes();
  const uint32_t me = links.me();
  const uint32_t right = (me + 1) % n;
  const uint32_t left = (me + n - 1) % n;
  const uint64_t count = operand.count();
  const size_t element = operand.element_bytes();
  const gradsync_op op = node_detail::network_op(operand.op());
  uint8_t* work = operand.work();
  const RingWire wire(operand, step.scratch, step.codec);
  // Every node computes the same cut: it depends on the count and node count only.
  const auto pieces = static_cast<uint32_t>(
      std::clamp<uint64_t>(count / n * element / step.piece_bytes, 1, kMaxPiecesPerStep));
  auto chunk_of = [n](int64_t c) { return static_cast<uint32_t>(((c % n) + n) % n); };
  auto piece = [&](uint32_t chunk, uint32_t j) {
    const uint64_t begin = count * chunk / n;
    const uint64_t end = count * (chunk + 1) / n;
    return Range{begin + (end - begin) * j / pieces, begin + (end - begin) * (j + 1) / pieces};
  };
  // Parts: reduce-scatter steps 0..n-2, then allgather steps n-1..2n-3; pieces within.
  auto tag = [&](uint32_t sender, uint32_t part_step, uint32_t j) {
    return links.tag(tags::kData, sender, step.sequence, part_step * pieces + j);
  };
  const uint32_t steps = n - 1;
  if (steps == 0) co_return "a ring needs two nodes or more";  // NodeJob runs rhd on one

  Flight flight(links, &step.scratch, operand.memory(), "running a ring allreduce");
  // Reduce-scatter step s receives chunk me-s-1 from the left; two slots alternate so that the
  // next step's receives are posted while this step's pieces are reduced.
  const std::array<uint8_t*, 2> received = wire.arrival_slots(step.scratch, count / n + 1);
  auto received_at = [&](uint32_t s, uint64_t offset) {
    return wire.arrival(received[s % 2], offset);
  };
  std::array<std::vector<size_t>, 2> posted;
  auto post_reduce_scatter_receives = [&](uint32_t s) {
    auto& ops = posted[s % 2];
    ops.clear();
    const uint32_t chunk = chunk_of(int64_t{me} - s - 1);
    const uint64_t chunk_begin = count * chunk / n;
    for (uint32_t j = 0; j < pieces; ++j) {
      const Range r = piece(chunk, j);
      ops.push_back(flight.add(step.receive(tag(left, s, j), left,
                                            received_at(s, r.begin - chunk_begin), wire.bytes(r))));
    }
  };
  // Step 0 sends this node's own chunk, reduced over the local ranks: kOwnPiecesAhead pieces
  // now, then one more each time one has been delivered, while step 0's pieces arrive.
  std::vector<size_t> reduce_scatter_sends;
  std::vector<size_t> own_sends;
  auto send_own_piece = [&](uint32_t j) {
    const Range r = piece(me, j);
    own_sends.push_back(flight.add(
        step.send(right, tag(me, 0, j), wire.first_outgoing(operand, op, r), wire.bytes(r))));
  };
  post_reduce_scatter_receives(0);
  for (uint32_t j = 0; j < std::min(pieces, kOwnPiecesAhead); ++j) {
    co_await step.pace(wire.bytes(piece(me, j)));
    send_own_piece(j);
  }
  for (uint32_t s = 0; s < steps; ++s) {
    if (s + 1 < steps) post_reduce_scatter_receives(s + 1);
    const uint32_t chunk = chunk_of(int64_t{me} - s - 1);
    const uint64_t chunk_begin = count * chunk / n;
    for (uint32_t j = 0; j < pieces; ++j) {
      if (const uint32_t next = j + kOwnPiecesAhead; s == 0 && next < pieces) {
        if (auto error = co_await flight.wait(own_sends[j])) co_return error;
        co_await step.pace(wire.bytes(piece(me, next)));
        send_own_piece(next);
      }
      if (auto error = co_await flight.wait(posted[s % 2][j])) co_return error;
      const Range r = piece(chunk, j);
      const bool forward = s + 1 < steps;  // sent on as the next reduce-scatter step
      wire.reduce_arrived(operand, op, r, received_at(s, r.begin - chunk_begin), forward);
      if (forward) {
        co_await step.pace(wire.bytes(r));
        reduce_scatter_sends.push_back(
            flight.add(step.send(right, tag(me, s + 1, j), wire.travelling(r), wire.bytes(r))));
        continue;
      }
      // This node's finished chunk: the average's one division happens here, then it goes out
      // as the first allgather step.
      if (operand.op() == GRADSYNC_AVG) {
        kernels::divide(operand.dtype(), work + r.begin * element, r.end - r.begin,
                        static_cast<uint64_t>(step.world_size));
      }
      wire.finish(r);
      co_await step.pace(wire.bytes(r));
      flight.add(step.send(right, tag(me, s + 1, j), wire.travelling(r), wire.bytes(r)));
    }
  }
  // Allgather step s receives chunk me-s into place (or into its wire image), where the
  // reduce-scatter send that read it must be done first; these sends matched receives the
  // right neighbour posted during its own reduce-scatter. (Not the first allgather sends: the
  // right neighbour posts their receives only after this point, and waiting for them here
  // would deadlock the ring.)
  for (const auto* sends : {&own_sends, &reduce_scatter_sends}) {
    for (const size_t send : *sends) {
      if (auto error = co_await flight.wait(send)) co_return error;
    }
  }
  std::vector<std::vector<size_t>> gathers(steps);
  for (uint32_t s = 0; s < steps; ++s) {
    const uint32_t chunk = chunk_of(int64_t{me} - s);
    for (uint32_t j = 0; j < pieces; ++j) {
      const Range r = piece(chunk, j);
      gathers[s].push_back(flight.add(
          step.receive(tag(left, steps + s, j), left, wire.travelling(r), wire.bytes(r))));
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
        co_await step.pace(wire.bytes(r));
        flight.add(step.send(right, tag(me, steps + s + 1, j), wire.travelling(r), wire.bytes(r)));
      }
      wire.landed(r);
      operand.deliver(r.begin, r.end);
    }
  }
  co_return co_await flight.wait_all();
}

}  // namespace gradsync::daemon
