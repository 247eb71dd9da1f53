#include "tools/model/data_path_model.h"
#include "tools/model/calibration.h"
#include "tools/model/validation.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <stdexcept>

namespace gradsync::model {
namespace {

// A host node: 5 us per collective, 10 GB/s of memory traffic for the local stages.
const NodeFigures kHost{5e-6, 10e9, false, false};
// 25 Gbit/s links with 10 us per message, a 20 GB/s reduction.
const LinkFigures kLink{10e-6, 8 / 25e9, 1 / 20e9};

TEST(DataPathModel, OneNodeIsTheOverheadAndTheLocalTraffic) {
  const uint64_t bytes = 64 << 20;
  const auto p = predict_allreduce({1, 4}, kHost, kLink, bytes);
  ASSERT_EQ(p.algorithms.size(), 1U);
  // Four ranks: every byte read and written once per rank.
  const double expected = 5e-6 + 2.0 * 4 * bytes / 10e9;
  EXPECT_DOUBLE_EQ(p.best().seconds, expected);
  EXPECT_DOUBLE_EQ(p.best().algbw_gbytes_per_second, bytes / expected / 1e9);
  EXPECT_DOUBLE_EQ(p.best().busbw_gbytes_per_second, bytes / expected / 1e9 * 2 * 3 / 4);
}

TEST(DataPathModel, HostStagesAddUpAcrossNodes) {
  const uint64_t bytes = 16 << 20;
  const auto p = predict_allreduce({4, 2}, kHost, kLink, bytes);
  ASSERT_EQ(p.algorithms.size(), 2U);
  const double local = 2.0 * 2 * bytes / 10e9;
  EXPECT_DOUBLE_EQ(p.algorithms[0].seconds,
                   5e-6 + local + cost_model::predict_ring(kLink, 4, bytes));
  EXPECT_DOUBLE_EQ(p.algorithms[1].seconds,
                   5e-6 + local + cost_model::predict_halving_doubling(kLink, 4, bytes));
  EXPECT_EQ(p.algorithms[0].algorithm, "ring");
  EXPECT_EQ(p.algorithms[1].algorithm, "rhd");
}

TEST(DataPathModel, TheCodecIsTheRingsStage) {
  const uint64_t bytes = 64 << 20;
  const auto p = predict_allreduce({4, 1}, kHost, kLink, bytes, {WireCodec::kBf16});
  ASSERT_EQ(p.algorithms.size(), 2U);
  EXPECT_EQ(p.algorithms[0].algorithm, "ring+bf16");
  const double local = 2.0 * bytes / 10e9;
  EXPECT_DOUBLE_EQ(p.algorithms[0].seconds,
                   5e-6 + local + cost_model::predict_ring(kLink, 4, bytes, WireCodec::kBf16));
  // Halving-doubling sends the values either way.
  EXPECT_DOUBLE_EQ(p.algorithms[1].seconds,
                   predict_allreduce({4, 1}, kHost, kLink, bytes).algorithms[1].seconds);
}

TEST(DataPathModel, TopKIsACarryPassAndTwoSmallAllreduces) {
  const uint64_t bytes = 64 << 20;
  const auto p = predict_allreduce({4, 1}, kHost, kLink, bytes, {WireCodec::kTopK, 1});
  ASSERT_EQ(p.algorithms.size(), 3U);
  EXPECT_EQ(p.best().algorithm, "topk:1");
  auto cheaper = [](uint64_t b) {
    return std::min(cost_model::predict_ring(kLink, 4, b),
                    cost_model::predict_halving_doubling(kLink, 4, b));
  };
  const double local = 2.0 * bytes / 10e9;
  const double carry = 4.0 * bytes / 10e9;
  // 2048 chunks of 32 KiB: 8 KiB of energies; 1% of the bytes chosen.
  EXPECT_DOUBLE_EQ(p.best().seconds, 5e-6 + local + carry + cheaper(8192) +
                                         cheaper(static_cast<uint64_t>(0.01 * bytes)));
  EXPECT_LT(p.best().seconds, p.algorithms[0].seconds);
  // At least one chunk: 64 KiB is two chunks, one of them sent.
  const auto small = predict_allreduce({4, 1}, kHost, kLink, 65536, {WireCodec::kTopK, 1});
  EXPECT_DOUBLE_EQ(small.best().seconds,
                   5e-6 + 2.0 * 65536 / 10e9 + 4.0 * 65536 / 10e9 + cheaper(8) + cheaper(32768));
  // Small enough to piggyback on the negotiation: exact.
  const auto tiny = predict_allreduce({4, 1}, kHost, kLink, 4096, {WireCodec::kTopK, 1});
  EXPECT_DOUBLE_EQ(tiny.best().seconds,
                   predict_allreduce({4, 1}, kHost, kLink, 4096).best().seconds);
}

// A calibrated pass replaces the pass priced from the local stages' bandwidth.
TEST(DataPathModel, TopKPassesComeFromTheCalibrationWhenItTimedThem) {
  const uint64_t bytes = 64 << 20;
  NodeFigures node = kHost;
  node.topk_pass_seconds_per_byte = 1 / 5e9;
  const auto uncalibrated = predict_allreduce({2, 1}, kHost, kLink, bytes, {WireCodec::kTopK, 1});
  const auto calibrated = predict_allreduce({2, 1}, node, kLink, bytes, {WireCodec::kTopK, 1});
  EXPECT_DOUBLE_EQ(calibrated.best().seconds - uncalibrated.best().seconds,
                   bytes / 5e9 - topk_passes({2, 1}, kHost, bytes));
  EXPECT_DOUBLE_EQ(topk_passes({2, 1}, node, bytes), bytes / 5e9);
}

TEST(DataPathModel, OverlappingStagesArePacedByTheSlowerOne) {
  const NodeFigures gpu{5e-6, 100e9, true, true};
  const uint64_t large = 256 << 20;
  const auto p = predict_allreduce({8, 8}, gpu, kLink, large);
  const double network = cost_model::predict_ring(kLink, 8, large);
  const double local = 2.0 * large / 100e9;  // per device, not per node
  ASSERT_GT(network, local);
  const double first_piece = local * kPipelinePieceBytes / large;
  EXPECT_NEAR(p.algorithms[0].seconds, 5e-6 + network + first_piece, 1e-12);
  // One piece: nothing to overlap with.
  const uint64_t small = 4096;
  const auto q = predict_allreduce({8, 8}, gpu, kLink, small);
  EXPECT_NEAR(q.algorithms[0].seconds,
              5e-6 + 2.0 * small / 100e9 + cost_model::predict_ring(kLink, 8, small), 1e-15);
}

TEST(DataPathModel, PicksWhatTheDaemonsWouldRun) {
  EXPECT_EQ(predict_allreduce({8, 1}, kHost, kLink, 1024).best().algorithm, "rhd");
  EXPECT_EQ(predict_allreduce({6, 1}, kHost, kLink, 256 << 20).best().algorithm, "ring");
  EXPECT_EQ(predict_allreduce({1, 8}, kHost, kLink, 1024).best().algorithm, "local");
}

TEST(DataPathModel, RefusesLayoutsAndSizesItCannotModel) {
  EXPECT_THROW(predict_allreduce({0, 1}, kHost, kLink, 8), std::invalid_argument);
  EXPECT_THROW(predict_allreduce({2, 1}, kHost, kLink, 0), std::invalid_argument);
  EXPECT_THROW(predict_allreduce({2, 1}, NodeFigures{}, kLink, 8), std::invalid_argument);
}

TEST(DataPathModel, ScalingEfficiencyIsComputeOverTheStep) {
  const TrainingStep step{0.1, 100 << 20, 0};
  const auto s = predict_scaling({4, 8}, kHost, kLink, step);
  const double comm = predict_allreduce({4, 8}, kHost, kLink, 100 << 20).best().seconds;
  EXPECT_DOUBLE_EQ(s.communication_seconds, comm);
  EXPECT_DOUBLE_EQ(s.step_seconds, 0.1 + comm);
  EXPECT_DOUBLE_EQ(s.efficiency, 0.1 / (0.1 + comm));
  EXPECT_DOUBLE_EQ(s.speedup, 32 * s.efficiency);
  // Hiding all of it behind the backward pass: perfect scaling.
  const auto hidden = predict_scaling({4, 8}, kHost, kLink, {10.0, 100 << 20, 0.5});
  EXPECT_DOUBLE_EQ(hidden.efficiency, 1.0);
  // One GPU has nothing to communicate.
  EXPECT_DOUBLE_EQ(predict_scaling({1, 1}, kHost, kLink, step).efficiency, 1.0);
  EXPECT_THROW(predict_scaling({2, 1}, kHost, kLink, {0, 8, 0}), std::invalid_argument);
  EXPECT_THROW(predict_scaling({2, 1}, kHost, kLink, {1, 8, 1.5}), std::invalid_argument);
}

// A calibration run whose timings are the model's own: fitting it gives the figures back.
CalibrationRun run_of(const Layout& layout, const NodeFigures& node, const LinkFigures& link) {
  CalibrationRun run;
  run.layout = layout;
  run.copy_bytes_per_second = 12e9;
  run.reduce_bytes_per_second = 1 / link.gamma_seconds_per_byte;
  run.large_bytes = 32 << 20;
  const Layout one_node{1, layout.ranks_per_node};
  run.local = {predict_allreduce(one_node, node, link, kCalibrationSmallBytes).best().seconds,
               predict_allreduce(one_node, node, link, run.large_bytes).best().seconds};
  if (layout.nodes > 1) {
    // Across the nodes: the ring first, halving-doubling second.
    const AllreducePrediction large = predict_allreduce(layout, node, link, run.large_bytes);
    run.cluster = {
        predict_allreduce(layout, node, link, kCalibrationSmallBytes).algorithms[0].seconds,
        large.algorithms[0].seconds};
    run.cluster_halving_doubling_large_seconds = large.algorithms[1].seconds;
    run.cluster_topk_large_seconds = predict_allreduce(layout, node, link, run.large_bytes,
                                                       {WireCodec::kTopK, kCalibrationTopKPercent})
                                         .best()
                                         .seconds;
  }
  return run;
}

TEST(Calibration, FittingTheModelsOwnTimingsGivesItsFiguresBack) {
  for (const Layout layout : {Layout{2, 1}, Layout{3, 2}, Layout{4, 4}}) {
    const Figures fitted = fit_figures(run_of(layout, kHost, kLink));
    const double tolerance = 1e-6;  // relative; the small timings carry 8 bytes of traffic
    EXPECT_NEAR(fitted.node.overhead_seconds / kHost.overhead_seconds, 1, 1e-2) << layout.nodes;
    EXPECT_NEAR(fitted.node.local_bytes_per_second / kHost.local_bytes_per_second, 1, tolerance);
    EXPECT_NEAR(fitted.link.alpha_seconds / kLink.alpha_seconds, 1, 1e-2) << layout.nodes;
    EXPECT_NEAR(fitted.link.beta_seconds_per_byte / kLink.beta_seconds_per_byte, 1, 1e-3);
    EXPECT_DOUBLE_EQ(fitted.link.gamma_seconds_per_byte, kLink.gamma_seconds_per_byte);
    EXPECT_FALSE(fitted.node.stages_overlap);
    // The top-k run's passes, per byte: what the model priced them at from the local stages.
    EXPECT_NEAR(
        fitted.node.topk_pass_seconds_per_byte * (32 << 20) / topk_passes(layout, kHost, 32 << 20),
        1, 1e-3)
        << layout.nodes;
  }
}

// A ring slowed by what its extra messages cost on shared cores says nothing about the wire:
// the faster algorithm's run sets β, whichever it is, and a calibration without
// halving-doubling's run (older files) fits the ring's.
TEST(Calibration, FitsTheWireToTheFasterAlgorithm) {
  for (const Layout layout : {Layout{3, 1}, Layout{4, 2}}) {
    CalibrationRun run = run_of(layout, kHost, kLink);
    const double ring = run.cluster->large_seconds;
    const double rhd = *run.cluster_halving_doubling_large_seconds;
    run.cluster->large_seconds = ring * 1.3;
    EXPECT_NEAR(fit_figures(run).link.beta_seconds_per_byte / kLink.beta_seconds_per_byte, 1, 1e-3)
        << layout.nodes;
    run.cluster->large_seconds = ring;
    *run.cluster_halving_doubling_large_seconds = rhd * 1.3;
    EXPECT_NEAR(fit_figures(run).link.beta_seconds_per_byte / kLink.beta_seconds_per_byte, 1, 1e-3)
        << layout.nodes;
    run.cluster->large_seconds = ring * 1.3;
    run.cluster_halving_doubling_large_seconds.reset();
    EXPECT_GT(fit_figures(run).link.beta_seconds_per_byte, kLink.beta_seconds_per_byte * 1.1)
        << layout.nodes;
  }
}

TEST(Calibration, RefusesTimingsThatCannotBeFitted) {
  CalibrationRun run = run_of({2, 1}, kHost, kLink);
  run.local.large_seconds = run.local.small_seconds;
  EXPECT_THROW(fit_figures(run), std::invalid_argument);
}

TEST(Calibration, SurvivesItsJsonAndNamesWhatIsMissing) {
  const CalibrationRun run = run_of({2, 2}, kHost, kLink);
  const CalibrationRun back = calibration_from_json(to_json(run));
  EXPECT_EQ(back.layout.nodes, 2U);
  EXPECT_EQ(back.layout.ranks_per_node, 2U);
  EXPECT_EQ(back.large_bytes, run.large_bytes);
  EXPECT_NEAR(back.cluster->large_seconds, run.cluster->large_seconds, 1e-12);
  EXPECT_NEAR(*back.cluster_halving_doubling_large_seconds,
              *run.cluster_halving_doubling_large_seconds, 1e-12);
  EXPECT_NEAR(*back.cluster_topk_large_seconds, *run.cluster_topk_large_seconds, 1e-12);
  nlohmann::json other_percent = to_json(run);
  other_percent["cluster"]["topk_percent"] = 5;
  EXPECT_THROW(calibration_from_json(other_percent), std::invalid_argument);
  nlohmann::json older = to_json(run);
  older["cluster"].erase("topk_large_us");
  EXPECT_FALSE(calibration_from_json(older).cluster_topk_large_seconds);
  EXPECT_NEAR(back.copy_bytes_per_second, run.copy_bytes_per_second, 1e-3);

  nlohmann::json missing = to_json(run);
  missing.erase("cluster");
  try {
    calibration_from_json(missing);
    FAIL() << "a two-node calibration without its cluster timings was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cluster"), std::string::npos) << e.what();
  }
  nlohmann::json negative = to_json(run);
  negative["local"]["small_us"] = -1;
  try {
    calibration_from_json(negative);
    FAIL() << "a negative timing was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("calibration.local: 'small_us'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(calibration_from_json(nlohmann::json{{"kind", "other"}}), std::invalid_argument);
}

TEST(Validation, PredictsEveryMeasuredRowOfAResult) {
  const Layout layout{2, 2};
  const nlohmann::json result = {
      {"layout", {{"nodes", 2}, {"ranks_per_node", 2}}},
      {"systems",
       {{"gradsync",
         {{"rows",
           {{{"bytes", 8}, {"time_us", 40.0}}, {{"bytes", 1 << 20}, {"time_us", 1000.0}}}}}}}}};
  const Figures figures{kHost, kLink};
  const auto rows = predict_measurements(figures, 512 << 10, result);
  ASSERT_EQ(rows.size(), 2U);
  EXPECT_EQ(rows[1].bytes, 1U << 20);
  EXPECT_DOUBLE_EQ(rows[1].measured_seconds, 1e-3);
  EXPECT_DOUBLE_EQ(rows[1].predicted_seconds,
                   predict_allreduce(layout, kHost, kLink, 1 << 20).best().seconds);
  EXPECT_DOUBLE_EQ(rows[1].relative_error(), rows[1].predicted_seconds / 1e-3 - 1);
  EXPECT_EQ(rows[0].regime, Regime::kLatency);
  EXPECT_EQ(rows[1].regime, Regime::kTransition);  // under four pipeline pieces
  EXPECT_EQ(regime_of(64 << 20, 32 << 20), Regime::kBandwidth);
  EXPECT_EQ(regime_of(16 << 20, 32 << 20), Regime::kTransition);  // fits the cache
}

}  // namespace
}  // namespace gradsync::model
