// The α-β-γ cost model of the inter-node allreduce (Thakur, Rabenseifner and Gropp's analysis
// of MPI collectives): α per message, β per byte on the wire, γ per byte reduced. The daemons
// measure α and β between themselves when a job forms, and γ on their own cores; every node
// then chooses the same algorithm for a given size, because all use the same figures. A job's
// own large allreduces refine β as it runs (implied_beta), since the probe at formation may
// share its cores with ranks still setting up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gradsync::cost_model {

// The data path's protocol sizes, which set the model's regimes:
//  - a small allreduce's contributions (and a small allgather's blocks, a node's together)
//    piggyback on the negotiation messages (negotiator.h): up to eager_max_bytes(), which is at
//    least kEagerMinBytes and at most kEagerCapBytes (between namespace nodes over TCP, since a
//    cycle's contributions travel as one blob, 32 KiB piggybacking takes about two thirds of
//    the time of the allreduce it saves; 64 KiB, a message past UCX's 64 KiB TCP receive
//    segment, twice that time);
//  - the ring cuts a node's slice into pieces of this size (fewer, larger ones above 64 of
//    them), and pipelines them. Each piece is a message with its own rendezvous, wake-ups and
//    completion, which on these hosts cost more than the overlap of a smaller piece saved: 2
//    namespace nodes, 16-64 MiB, 512 KiB pieces took 20-30% longer than 4 MiB ones.
inline constexpr uint64_t kEagerMinBytes = 4096;
inline constexpr uint64_t kEagerCapBytes = 32 << 10;
inline constexpr uint64_t kPipelinePieceBytes = 4 << 20;
// Allreduces from this size up refine the link's β: below it, the α terms and the noise of a
// shared machine say more about a run's time than the wire does.
inline constexpr uint64_t kRefineBetaMinBytes = 4 << 20;

// Link figures of the α-β-γ cost model, as one node measured them.
struct LinkFigures {
  double alpha_seconds = 0;           // per message
  double beta_seconds_per_byte = 0;   // on the wire
  double gamma_seconds_per_byte = 0;  // to reduce
};

// kAggregate and kSplit run through the job's aggregators (docs/aggregators.md): the whole
// buffer, or a share of it while the ring among the nodes runs the rest. kDirect adds every
// element in node order whatever the fusion (node_direct_allreduce.cpp): it runs where a job
// forces it, for results that repeat to the bit; the measured choice never makes it.
enum class AllreduceAlgorithm { kRing, kHalvingDoubling, kAggregate, kSplit, kDirect };

// A job's aggregators as the model sees them: how many, and the wire β of each one's link.
struct AggregatorFigures {
  uint32_t count = 0;  // 0: the job has none
  double beta_seconds_per_byte = 0;
};

// What a job's f32 allreduces send between nodes (kernels/codec.h, kernels/sparse.h): the
// values themselves; rounded to bf16 (half the bytes; the ring only, see
// node_ring_allreduce.cpp); or, for sums and averages, the chunks of each tensor with the most
// energy, the rest held back and added to the tensor's next allreduce (top-k chunk
// sparsification with error feedback, node_topk_allreduce.cpp).
enum class WireCodec { kNone, kBf16, kTopK };

// A wire codec with its parameter: the share of each tensor's chunks that top-k sends.
struct WireCodecSpec {
  WireCodec codec = WireCodec::kNone;
  double topk_percent = 1;  // of each tensor's chunks, rounded up to whole chunks; (0, 100]
  bool operator==(const WireCodecSpec&) const = default;
};
// Top-k's unit of selection: 32 KiB of f32, a copy and a norm worth their bookkeeping.
inline constexpr uint64_t kTopKChunkElements = 8192;

// Where UCX reaches the other nodes over TCP only, it sends a large message after a
// rendezvous: the receiver answers an announcement before the data moves, so that no copy is
// made on either side. On a slow link the answer waits behind the data already queued on the
// receiver's own link (a shaper's queue, a switch's buffer), and the sender's link idles for
// it; an eager message needs no answer and costs a copy on each side, which a slow wire hides.
// Eager pays where the wire is this many times slower per byte than a reduce (β ≥ 64γ): two
// namespace nodes measured rendezvous 1.2-1.9x faster at β ≈ 6γ (unshaped) and eager 1-2%
// faster at β ≈ 250γ (1 Gbit/s links). Room on both sides: a probe on busy cores measures the
// wire slower than it is (an unshaped link at 19γ while tests ran beside it).
inline constexpr double kEagerBulkMinWireOverReduce = 64;
// The link is slow next to this node's copies, as above; false where either is not measured.
bool eager_bulk_pays(const LinkFigures& link);

// "ring", "rhd", "aggregate", "split", "direct"; nullopt for "auto" or "".
std::optional<AllreduceAlgorithm> parse_algorithm(std::string_view name);
const char* algorithm_name(AllreduceAlgorithm algorithm);
// "none", "bf16", "topk" or "topk:PERCENT" (say "topk:0.5"); nullopt for anything else.
std::optional<WireCodecSpec> parse_wire_codec(std::string_view name);
// The name parse_wire_codec reads back: "none", "bf16", "topk:1".
std::string wire_codec_name(const WireCodecSpec& spec);
const char* wire_codec_name(WireCodec codec);  // without the parameter: "topk"

// Predicted seconds for an allreduce of `bytes` among `nodes` nodes.
//  ring: 2(n-1) steps of a 1/n slice; bandwidth-optimal, latency linear in n.
//  rhd (recursive halving-doubling, Rabenseifner): 2 log2(p) steps of halving slices among the
//    largest power of two p <= n; the n-p extra nodes first fold their data into a partner and
//    get the result back, two more full-size steps.
//  ring with the bf16 codec: half the bytes on the wire, and the codec's passes over the data
//    (each step encodes what it sends and decodes what it receives; the finished slice is
//    rounded and encoded in one pass; the allgather forwards without encoding again), 3n-2
//    passes over a 1/n slice. A pass reads and writes half the traffic of a two-input reduce
//    per byte: γ/2.
double predict_ring(const LinkFigures& link, uint32_t nodes, uint64_t bytes,
                    WireCodec codec = WireCodec::kNone);
double predict_halving_doubling(const LinkFigures& link, uint32_t nodes, uint64_t bytes);
//  direct: every node sends each other node its partial sums of that node's 1/n, then the
//    finished 1/n to every other node: two steps of n-1 messages, the ring's bytes on the
//    wire, (n-1)/n of the data reduced.
double predict_direct(const LinkFigures& link, uint32_t nodes, uint64_t bytes);

// Through k aggregators (the PHub and BytePS summation service), of `share` of the bytes
// while the ring runs the rest (share 1: aggregation alone). Chunks stream, so the busier of
// the two links bounds the time: a node's carries the aggregated share once each way and the
// ring's share 2(n-1)/n times; an aggregator's carries n/k of the aggregated share each way,
// and reduces it. The first chunk's push and sum add two messages.
double predict_aggregate(const LinkFigures& link, uint32_t nodes,
                         const AggregatorFigures& aggregators, uint64_t bytes, double share = 1);
// The share of a buffer the split sends through the aggregators: where the nodes' links and
// the aggregators' are equally busy, within [0, 1] (BytePS's balance; 1 with two nodes or
// fewer, where the ring gains nothing on a node's link).
double aggregated_share(uint32_t nodes, const LinkFigures& link,
                        const AggregatorFigures& aggregators);

double predict_allreduce(AllreduceAlgorithm algorithm, const LinkFigures& link, uint32_t nodes,
                         uint64_t bytes, WireCodec codec = WireCodec::kNone,
                         const AggregatorFigures& aggregators = {});

// The β that makes `algorithm`'s prediction for `bytes` equal to `seconds`, a measured run,
// with the other figures as in `link`; nullopt where the run took no longer than its α and γ
// terms (nothing to learn about the wire). A run slowed by anything (a busy core, another
// collective in flight) implies a larger β than the wire's, never a smaller one, so the
// smallest seen is the best estimate.
std::optional<double> implied_beta(AllreduceAlgorithm algorithm, const LinkFigures& link,
                                   uint32_t nodes, uint64_t bytes, WireCodec codec, double seconds);

// The time of the cheaper of the two.
double predict_cheaper(const LinkFigures& link, uint32_t nodes, uint64_t bytes);

// The cheapest; ring when they tie (or nothing was measured). `codec`: what the ring and the
// aggregators would send (halving-doubling always sends the values). With aggregators,
// aggregation and the split are candidates too.
AllreduceAlgorithm choose_allreduce(const LinkFigures& link, uint32_t nodes, uint64_t bytes,
                                    WireCodec codec = WireCodec::kNone,
                                    const AggregatorFigures& aggregators = {});

// Broadcast across nodes (node_direct_broadcast.cpp, node_chain_broadcast.cpp):
//  direct: the root's node sends the whole buffer to every other node at once. One step, but
//    n-1 copies leave on the root's link: α + (n-1)Sβ.
//  chain: the buffer travels in P pieces along the ring from the root's node, each node sending
//    every piece on as it lands (NCCL's ring broadcast). Every link carries S once, wherever
//    the root is, and the pipeline fills in n-2 pieces' time: (P+n-2)(α + Sβ/P). Pieces are
//    kPipelinePieceBytes, as the ring's, and at most kMaxBroadcastPieces (1 MiB pieces took
//    5-20% longer than 4 MiB ones from 4 to 64 MiB on 3 and 4 namespace nodes).
// The chain pays from 3 nodes and 2 pieces; on 2 nodes it is the direct broadcast's message in
// pieces.
enum class BroadcastAlgorithm { kDirect, kChain };
inline constexpr uint32_t kMaxBroadcastPieces = 64;
const char* broadcast_algorithm_name(BroadcastAlgorithm algorithm);  // "direct", "chain"
uint32_t chain_broadcast_pieces(uint64_t bytes);
double predict_broadcast(BroadcastAlgorithm algorithm, const LinkFigures& link, uint32_t nodes,
                         uint64_t bytes);
// The cheaper of the two; direct when they tie (or nothing was measured).
BroadcastAlgorithm choose_broadcast(const LinkFigures& link, uint32_t nodes, uint64_t bytes);

// Allreduces smaller than this are worth fusing. Fusing one into a shared buffer saves the
// messages of an allreduce of its own (the latency term of the cheaper algorithm) and costs a
// copy in and a copy out (about 2γ per byte): below the size where the two are equal, fusion
// wins. Without a measured γ, everything is.
uint64_t fusion_cutoff_bytes(const LinkFigures& link, uint32_t nodes);

// The largest allreduce whose contributions piggyback on the negotiation: a power of two from
// kEagerMinBytes to kEagerCapBytes. Riding sends a node's data to every other node and reduces
// all of them, (n-1)(β+γ) per byte, and saves the allreduce of its own that would follow the
// negotiation (the cheaper algorithm's time): it pays up to the size where the two meet, which
// shrinks as nodes are added. Without measured figures: kEagerMinBytes. Every node computes
// the same from the agreed figures; where two did not, the collective takes the network.
uint64_t eager_max_bytes(const LinkFigures& link, uint32_t nodes);

}  // namespace gradsync::cost_model
