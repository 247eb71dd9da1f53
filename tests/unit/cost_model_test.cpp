#include "cost_model/cost_model.h"
#include "daemon/node/link_probe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <vector>

namespace gradsync::cost_model {
namespace {

// About a 25 Gbit/s network with 10 us per message, and a 10 GB/s reduction.
const LinkFigures kLink{10e-6, 1.0 / 3.125e9, 1.0 / 10e9};

TEST(CostModel, RingMatchesItsClosedForm) {
  const uint64_t bytes = 64 << 20;
  const double n = 4;
  const double expected =
      2 * (n - 1) * (kLink.alpha_seconds + bytes / n * kLink.beta_seconds_per_byte) +
      (n - 1) * bytes / n * kLink.gamma_seconds_per_byte;
  EXPECT_DOUBLE_EQ(predict_ring(kLink, 4, bytes), expected);
  EXPECT_EQ(predict_ring(kLink, 1, bytes), 0);
}

TEST(CostModel, TheBf16CodecHalvesTheWireAndAddsItsPasses) {
  const uint64_t bytes = 64 << 20;
  const double n = 4;
  const double slice = bytes / n;
  // Half of each slice on the wire; the reduce, plus 3n-2 codec passes at half its cost.
  const double expected =
      2 * (n - 1) * (kLink.alpha_seconds + slice / 2 * kLink.beta_seconds_per_byte) +
      (n - 1 + (3 * n - 2) / 2) * slice * kLink.gamma_seconds_per_byte;
  EXPECT_DOUBLE_EQ(predict_ring(kLink, 4, bytes, WireCodec::kBf16), expected);
  // On a slow link the wire dominates: nearly twice as fast. On a link faster than the codec's
  // passes, slower: the chooser then takes halving-doubling where it is cheaper.
  const LinkFigures slow{10e-6, 8 / 1e9, 1 / 10e9};
  EXPECT_LT(predict_ring(slow, 4, bytes, WireCodec::kBf16), 0.6 * predict_ring(slow, 4, bytes));
  const LinkFigures fast{1e-6, 8 / 400e9, 1 / 10e9};
  EXPECT_GT(predict_ring(fast, 4, bytes, WireCodec::kBf16), predict_ring(fast, 4, bytes));
}

TEST(CostModel, EagerBulkDataPaysOnlyWhereTheWireIsSlowNextToTheCopies) {
  const double gamma = 1 / 30e9;  // a reduce at 30 GB/s
  auto link = [&](double wire_bytes_per_second) {
    return LinkFigures{10e-6, 1 / wire_bytes_per_second, gamma};
  };
  EXPECT_TRUE(eager_bulk_pays(link(0.125e9)));  // 1 Gbit/s
  EXPECT_FALSE(eager_bulk_pays(link(5e9)));     // unshaped namespace nodes
  EXPECT_TRUE(eager_bulk_pays(link(30e9 / kEagerBulkMinWireOverReduce)));
  EXPECT_FALSE(eager_bulk_pays(link(30e9 / kEagerBulkMinWireOverReduce * 1.01)));
  EXPECT_FALSE(eager_bulk_pays(LinkFigures{10e-6, 1 / 0.125e9, 0})) << "γ not measured";
  EXPECT_FALSE(eager_bulk_pays(LinkFigures{}));
}

TEST(CostModel, WireCodecsHaveNames) {
  EXPECT_EQ(parse_wire_codec("bf16"), WireCodecSpec{WireCodec::kBf16});
  EXPECT_EQ(parse_wire_codec("none"), WireCodecSpec{});
  EXPECT_EQ(parse_wire_codec("fp8"), std::nullopt);
  EXPECT_STREQ(wire_codec_name(WireCodec::kBf16), "bf16");
  EXPECT_STREQ(wire_codec_name(WireCodec::kNone), "none");
  EXPECT_STREQ(wire_codec_name(WireCodec::kTopK), "topk");
}

TEST(CostModel, TopKNamesItsShareOfChunks) {
  EXPECT_EQ(parse_wire_codec("topk"), (WireCodecSpec{WireCodec::kTopK, 1}));
  EXPECT_EQ(parse_wire_codec("topk:0.5"), (WireCodecSpec{WireCodec::kTopK, 0.5}));
  EXPECT_EQ(parse_wire_codec("topk:100"), (WireCodecSpec{WireCodec::kTopK, 100}));
  for (const char* bad : {"topk:", "topk:0", "topk:-1", "topk:101", "topk:1%", "topk:nan",
                          "topk:inf", "topk1", "topk:1:2"}) {
    EXPECT_EQ(parse_wire_codec(bad), std::nullopt) << bad;
  }
  // What a node sends in its Joined message reads back as the same codec.
  for (const double percent : {1.0, 0.5, 12.5, 0.1, 100.0}) {
    const WireCodecSpec spec{WireCodec::kTopK, percent};
    EXPECT_EQ(parse_wire_codec(wire_codec_name(spec)), spec) << wire_codec_name(spec);
  }
  EXPECT_EQ(wire_codec_name(WireCodecSpec{WireCodec::kTopK, 0.5}), "topk:0.5");
  EXPECT_EQ(wire_codec_name(WireCodecSpec{WireCodec::kBf16}), "bf16");
}

TEST(CostModel, HalvingDoublingNeedsLogarithmicallyManySteps) {
  // Small messages: latency dominates, 2 log2(8) = 6 steps against the ring's 14.
  EXPECT_NEAR(predict_halving_doubling(kLink, 8, 8), 6 * kLink.alpha_seconds, 1e-7);
  EXPECT_NEAR(predict_ring(kLink, 8, 8), 14 * kLink.alpha_seconds, 1e-7);
  // A node count that is not a power of two pays two full-size steps more.
  EXPECT_GT(predict_halving_doubling(kLink, 5, 1 << 20),
            predict_halving_doubling(kLink, 4, 1 << 20));
}

TEST(CostModel, ChoosesHalvingDoublingForSmallAndRingForLargeTensors) {
  EXPECT_EQ(choose_allreduce(kLink, 8, 1024), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(choose_allreduce(kLink, 6, 256 << 20), AllreduceAlgorithm::kRing);
  // Two nodes: the same two steps either way; the tie goes to the ring.
  EXPECT_EQ(choose_allreduce(kLink, 2, 1024), AllreduceAlgorithm::kRing);
  EXPECT_EQ(choose_allreduce(LinkFigures{}, 8, 1024), AllreduceAlgorithm::kRing);
}

// Aggregators as fast as the nodes (BytePS's balanced case).
const AggregatorFigures kFour{4, kLink.beta_seconds_per_byte};
const AggregatorFigures kTwo{2, kLink.beta_seconds_per_byte};

TEST(CostModel, AggregationCarriesTheBufferOnceOverANodesLink) {
  const uint64_t bytes = 64 << 20;
  // 4 nodes, 4 aggregators: a node's link carries the bytes once, each aggregator's n/k = 1
  // times and reduces them; the ring's carries 2(n-1)/n = 1.5 times.
  const double node_link = bytes * kLink.beta_seconds_per_byte;
  const double aggregator_link =
      bytes * (kFour.beta_seconds_per_byte + kLink.gamma_seconds_per_byte);
  EXPECT_DOUBLE_EQ(predict_aggregate(kLink, 4, kFour, bytes),
                   2 * kLink.alpha_seconds + std::max(node_link, aggregator_link));
  EXPECT_LT(predict_aggregate(kLink, 4, kFour, bytes), predict_ring(kLink, 4, bytes));
  EXPECT_EQ(predict_aggregate(kLink, 4, AggregatorFigures{}, bytes), 0);
  EXPECT_EQ(predict_aggregate(kLink, 1, kFour, bytes), 0);
}

TEST(CostModel, TheSplitBalancesTheNodesLinksAgainstTheAggregators) {
  // 2 nodes: the ring carries the bytes once each way already; everything may go through
  // the aggregators.
  EXPECT_EQ(aggregated_share(2, kLink, kTwo), 1);
  EXPECT_EQ(aggregated_share(4, kLink, AggregatorFigures{}), 1);
  // 4 nodes, 2 aggregators: at the share, both links are equally busy, and the split beats
  // aggregation alone (the aggregators' links bound it) and the ring.
  const double share = aggregated_share(4, kLink, kTwo);
  ASSERT_GT(share, 0);
  ASSERT_LT(share, 1);
  const double n = 4;
  const double node = share + (1 - share) * 2 * (n - 1) / n;
  const double aggregator = share * n / kTwo.count *
                            (kTwo.beta_seconds_per_byte + kLink.gamma_seconds_per_byte) /
                            kLink.beta_seconds_per_byte;
  EXPECT_NEAR(node, aggregator, 1e-12);
  const uint64_t bytes = 64 << 20;
  const double split =
      predict_allreduce(AllreduceAlgorithm::kSplit, kLink, 4, bytes, WireCodec::kNone, kTwo);
  EXPECT_LT(split, predict_allreduce(AllreduceAlgorithm::kAggregate, kLink, 4, bytes,
                                     WireCodec::kNone, kTwo));
  EXPECT_LT(split, predict_ring(kLink, 4, bytes));
  // Slow aggregators take a small share.
  EXPECT_LT(aggregated_share(4, kLink, {2, 10 * kLink.beta_seconds_per_byte}), share);
}

TEST(CostModel, ChoosesAggregatorsWhereTheyPay) {
  const uint64_t bytes = 64 << 20;
  // As many aggregators as nodes, summing for free: everything through them.
  LinkFigures free_sums = kLink;
  free_sums.gamma_seconds_per_byte = 0;
  EXPECT_EQ(choose_allreduce(free_sums, 4, bytes, WireCodec::kNone, kFour),
            AllreduceAlgorithm::kAggregate);
  // Their sums cost their time too: a share stays with the ring.
  EXPECT_EQ(choose_allreduce(kLink, 4, bytes, WireCodec::kNone, kFour), AllreduceAlgorithm::kSplit);
  EXPECT_EQ(choose_allreduce(kLink, 4, bytes, WireCodec::kNone, kTwo), AllreduceAlgorithm::kSplit);
  // Aggregators ten times slower than the nodes: never everything through them.
  EXPECT_NE(
      choose_allreduce(kLink, 4, bytes, WireCodec::kNone, {4, 10 * kLink.beta_seconds_per_byte}),
      AllreduceAlgorithm::kAggregate);
  // Nothing measured: the ring, whatever the aggregators.
  EXPECT_EQ(choose_allreduce(LinkFigures{}, 4, bytes, WireCodec::kNone, kFour),
            AllreduceAlgorithm::kRing);
  EXPECT_EQ(parse_algorithm("aggregate"), AllreduceAlgorithm::kAggregate);
  EXPECT_EQ(parse_algorithm("split"), AllreduceAlgorithm::kSplit);
  EXPECT_STREQ(algorithm_name(AllreduceAlgorithm::kSplit), "split");
}

// The direct allreduce: the ring's bytes and reduce, 2(n-1) messages in two steps; forced
// only, never the measured choice.
TEST(CostModel, TheDirectAllreduceIsForcedOnly) {
  const uint64_t bytes = 64 << 20;
  const double s = static_cast<double>(bytes);
  EXPECT_DOUBLE_EQ(predict_direct(kLink, 4, bytes), 6 * kLink.alpha_seconds +
                                                        1.5 * s * kLink.beta_seconds_per_byte +
                                                        0.75 * s * kLink.gamma_seconds_per_byte);
  EXPECT_DOUBLE_EQ(
      predict_allreduce(AllreduceAlgorithm::kDirect, kLink, 4, bytes, WireCodec::kNone),
      predict_direct(kLink, 4, bytes));
  EXPECT_EQ(predict_direct(kLink, 1, bytes), 0);
  for (const uint64_t size : {uint64_t{8}, uint64_t{1} << 20, bytes}) {
    for (const uint32_t nodes : {2u, 3u, 8u, 64u}) {
      EXPECT_NE(choose_allreduce(kLink, nodes, size, WireCodec::kNone),
                AllreduceAlgorithm::kDirect);
    }
  }
  EXPECT_EQ(parse_algorithm("direct"), AllreduceAlgorithm::kDirect);
  EXPECT_STREQ(algorithm_name(AllreduceAlgorithm::kDirect), "direct");
}

TEST(CostModel, BroadcastsMatchTheirClosedForms) {
  const uint64_t bytes = 64 << 20;
  const double wire = bytes * kLink.beta_seconds_per_byte;
  EXPECT_DOUBLE_EQ(predict_broadcast(BroadcastAlgorithm::kDirect, kLink, 4, bytes),
                   kLink.alpha_seconds + 3 * wire);
  const double pieces = chain_broadcast_pieces(bytes);
  EXPECT_EQ(pieces, 16);  // of kPipelinePieceBytes
  EXPECT_DOUBLE_EQ(predict_broadcast(BroadcastAlgorithm::kChain, kLink, 4, bytes),
                   (pieces + 2) * (kLink.alpha_seconds + wire / pieces));
  EXPECT_EQ(predict_broadcast(BroadcastAlgorithm::kChain, kLink, 1, bytes), 0);
  EXPECT_EQ(chain_broadcast_pieces(1), 1u);
  EXPECT_EQ(chain_broadcast_pieces(uint64_t{1} << 40), kMaxBroadcastPieces);
}

TEST(CostModel, BroadcastsGoAlongAChainWhereItSavesTheRootsLink) {
  // Large broadcasts on 3 nodes and more: the chain, whose links carry the buffer once.
  EXPECT_EQ(choose_broadcast(kLink, 3, 64 << 20), BroadcastAlgorithm::kChain);
  EXPECT_EQ(choose_broadcast(kLink, 16, 8 << 20), BroadcastAlgorithm::kChain);
  // A buffer of one piece: its chain is n-1 steps of the whole, the direct one a step.
  EXPECT_EQ(choose_broadcast(kLink, 16, kPipelinePieceBytes), BroadcastAlgorithm::kDirect);
  EXPECT_EQ(choose_broadcast(kLink, 4, 4096), BroadcastAlgorithm::kDirect);
  // On 2 nodes the chain is the direct message in pieces: never cheaper.
  EXPECT_EQ(choose_broadcast(kLink, 2, 256 << 20), BroadcastAlgorithm::kDirect);
  EXPECT_EQ(choose_broadcast(LinkFigures{}, 4, 64 << 20), BroadcastAlgorithm::kDirect)
      << "nothing measured";
  EXPECT_STREQ(broadcast_algorithm_name(BroadcastAlgorithm::kChain), "chain");
  EXPECT_STREQ(broadcast_algorithm_name(BroadcastAlgorithm::kDirect), "direct");
}

TEST(CostModel, FusesTensorsWhoseMessagesCostMoreThanTheirCopies) {
  // Two nodes: an allreduce of its own costs 2 alpha in messages; fused, a tensor costs a copy
  // in and a copy out, 2 gamma per byte.
  const double expected = 2 * kLink.alpha_seconds / (2 * kLink.gamma_seconds_per_byte);
  EXPECT_NEAR(static_cast<double>(fusion_cutoff_bytes(kLink, 2)), expected, 1.0);
  // More nodes, more messages per allreduce (6 alpha with halving-doubling on 8): more to save.
  EXPECT_NEAR(static_cast<double>(fusion_cutoff_bytes(kLink, 8)), 3 * expected, 3.0);
  // Nothing measured: fuse everything (the fusion threshold still bounds a batch).
  EXPECT_EQ(fusion_cutoff_bytes(LinkFigures{}, 4), UINT64_MAX);
}

TEST(CostModel, SmallAllreducesRideWithTheNegotiationWhileThatIsCheaper) {
  // 25 Gbit/s, 10 us: two nodes save an allreduce of their own up to the cap; with more nodes
  // every node sends its data to more peers, and the limit shrinks.
  EXPECT_EQ(eager_max_bytes(kLink, 2), kEagerCapBytes);
  uint64_t previous = kEagerCapBytes;
  for (uint32_t nodes : {4u, 8u, 16u, 64u, 256u}) {
    const uint64_t limit = eager_max_bytes(kLink, nodes);
    EXPECT_LE(limit, previous) << nodes << " nodes";
    EXPECT_GE(limit, kEagerMinBytes);
    EXPECT_TRUE(std::has_single_bit(limit));
    // At the limit piggybacking is cheaper than the allreduce it saves; at twice the limit it is
    // not.
    const auto piggybacks = [&](uint64_t bytes) {
      return (nodes - 1.0) * (kLink.beta_seconds_per_byte + kLink.gamma_seconds_per_byte) *
                 static_cast<double>(bytes) <
             std::min(predict_ring(kLink, nodes, bytes),
                      predict_halving_doubling(kLink, nodes, bytes));
    };
    if (limit > kEagerMinBytes) {
      EXPECT_TRUE(piggybacks(limit)) << nodes << " nodes";
    }
    if (limit < kEagerCapBytes) {
      EXPECT_FALSE(piggybacks(2 * limit)) << nodes << " nodes";
    }
    previous = limit;
  }
  EXPECT_LT(eager_max_bytes(kLink, 256), kEagerCapBytes);
  // Nothing measured, or one node: the floor.
  EXPECT_EQ(eager_max_bytes(LinkFigures{}, 2), kEagerMinBytes);
  EXPECT_EQ(eager_max_bytes(kLink, 1), kEagerMinBytes);
}

TEST(CostModel, ImpliedBetaInvertsEveryPrediction) {
  const uint64_t bytes = 64 << 20;
  for (const uint32_t nodes : {2U, 3U, 4U, 6U}) {
    for (const auto algorithm : {AllreduceAlgorithm::kRing, AllreduceAlgorithm::kHalvingDoubling}) {
      for (const auto codec : {WireCodec::kNone, WireCodec::kBf16}) {
        const double seconds = predict_allreduce(algorithm, kLink, nodes, bytes, codec);
        const auto beta = implied_beta(algorithm, kLink, nodes, bytes, codec, seconds);
        ASSERT_TRUE(beta.has_value()) << nodes << " nodes";
        EXPECT_NEAR(*beta, kLink.beta_seconds_per_byte, 1e-6 * kLink.beta_seconds_per_byte)
            << nodes << " nodes, " << algorithm_name(algorithm) << ", " << wire_codec_name(codec);
        // A slower run implies a slower wire.
        EXPECT_GT(*implied_beta(algorithm, kLink, nodes, bytes, codec, 2 * seconds), *beta);
      }
    }
  }
  EXPECT_DOUBLE_EQ(predict_allreduce(AllreduceAlgorithm::kRing, kLink, 4, bytes),
                   predict_ring(kLink, 4, bytes));
}

TEST(CostModel, ARunNoSlowerThanItsLatencyAndReduceTermsImpliesNoBeta) {
  LinkFigures no_wire = kLink;
  no_wire.beta_seconds_per_byte = 0;
  const double floor = predict_ring(no_wire, 4, 64 << 20);
  EXPECT_FALSE(
      implied_beta(AllreduceAlgorithm::kRing, kLink, 4, 64 << 20, WireCodec::kNone, floor));
  EXPECT_FALSE(implied_beta(AllreduceAlgorithm::kRing, kLink, 1, 64 << 20, WireCodec::kNone, 1.0));
}

TEST(LinkProbe, PreemptedRoundsDoNotSkewTheFigures) {
  // 20 µs a small round and 520 µs for 1 MB when undisturbed (2 GB/s); a rank busy on the
  // daemon's core stretches most rounds by milliseconds.
  const std::vector<double> small{250e-6, 20e-6, 900e-6, 21e-6, 300e-6, 2e-3, 22e-6};
  const std::vector<double> large{8e-3, 4e-3, 520e-6, 9e-3, 3e-3};
  const LinkFigures figures = daemon::link_figures_from_rounds(small, large, 1'000'000);
  EXPECT_DOUBLE_EQ(figures.alpha_seconds, 20e-6);
  EXPECT_NEAR(figures.beta_seconds_per_byte, 500e-6 / 1e6, 1e-15);
}

TEST(LinkProbe, NoRoundsGiveNoFigures) {
  const LinkFigures figures = daemon::link_figures_from_rounds({}, {1e-3}, 1 << 20);
  EXPECT_EQ(figures.alpha_seconds, 0);
  EXPECT_EQ(figures.beta_seconds_per_byte, 0);
}

TEST(CostModel, ParsesAlgorithmNames) {
  EXPECT_EQ(parse_algorithm("ring"), AllreduceAlgorithm::kRing);
  EXPECT_EQ(parse_algorithm("rhd"), AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(parse_algorithm("auto"), std::nullopt);
  EXPECT_STREQ(algorithm_name(AllreduceAlgorithm::kHalvingDoubling), "rhd");
}

}  // namespace
}  // namespace gradsync::cost_model
