// gradsync-model: what an allreduce, or a training step, would cost on N nodes x K GPUs, from
// the α-β-γ model of the data path (data_path_model.h) with figures either measured here
// (--calibration, from `gradsync-bench --calibrate`) or given for a machine nobody can run here.
#include "tools/common/sizes.h"
#include "tools/model/calibration.h"
#include "tools/model/data_path_model.h"
#include "tools/model/validation.h"

#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>
#include <string>

namespace {

using gradsync::model::Figures;
using gradsync::model::Layout;
using nlohmann::json;

// Figures for a GPU node when nothing was measured: NVLink-class bandwidth per device, a
// daemon launching on its own streams, copy engines beside the NIC. Assumptions, printed with
// every prediction that rests on them.
constexpr double kGpuOverheadUs = 20;
constexpr double kGpuLocalGbytesPerSecond = 100;

struct Options {
  Layout layout;
  std::string bytes = "64M";
  std::optional<double> link_gbps;   // Gbit/s, the network's unit
  std::optional<double> latency_us;  // one way, per message
  std::optional<double> overhead_us;
  std::optional<double> local_gbytes_per_second;
  std::optional<double> reduce_gbytes_per_second;
  std::string calibration;
  std::optional<double> compute_ms;
  std::string gradient_bytes;
  double overlap_fraction = 0;
  std::string validate;
  double tolerance = 0.15;
  std::string validate_from = "0";
  std::string wire_codec = "none";
  uint32_t aggregators = 0;
  std::optional<double> aggregator_gbps;  // default: the nodes' link
  bool json = false;
};

// The figures the prediction uses, and where each came from.
Figures resolve_figures(const Options& o, std::string& basis) {
  Figures figures;
  if (!o.calibration.empty()) {
    figures = gradsync::model::fit_figures(gradsync::model::load_calibration(o.calibration));
    basis = "host path, calibrated from " + o.calibration;
  } else {
    figures.node = {kGpuOverheadUs / 1e6, kGpuLocalGbytesPerSecond * 1e9, true, true};
    figures.link.gamma_seconds_per_byte = 1 / (kGpuLocalGbytesPerSecond * 1e9);
    basis = fmt::format(
        "GPU nodes, assumed: {} us per collective, {} GB/s per device within a node, stages "
        "overlapping",
        kGpuOverheadUs, kGpuLocalGbytesPerSecond);
  }
  if (o.overhead_us) figures.node.overhead_seconds = *o.overhead_us / 1e6;
  if (o.local_gbytes_per_second)
    figures.node.local_bytes_per_second = *o.local_gbytes_per_second * 1e9;
  if (o.reduce_gbytes_per_second) {
    figures.link.gamma_seconds_per_byte = 1 / (*o.reduce_gbytes_per_second * 1e9);
  }
  if (o.link_gbps) figures.link.beta_seconds_per_byte = 8 / (*o.link_gbps * 1e9);
  if (o.latency_us) figures.link.alpha_seconds = *o.latency_us / 1e6;
  if (o.layout.nodes > 1 && o.calibration.empty() && (!o.link_gbps || !o.latency_us)) {
    throw std::invalid_argument(
        "across nodes, give --link-gbps and --latency-us, or --calibration");
  }
  return figures;
}

json figures_json(const Figures& f) {
  return {
      {"overhead_us", f.node.overhead_seconds * 1e6},
      {"local_gbytes_per_s", f.node.local_bytes_per_second / 1e9},
      {"local_per_device", f.node.local_per_device},
      {"stages_overlap", f.node.stages_overlap},
      {"link_latency_us", f.link.alpha_seconds * 1e6},
      {"link_gbps", f.link.beta_seconds_per_byte > 0 ? 8 / f.link.beta_seconds_per_byte / 1e9 : 0},
      {"reduce_gbytes_per_s",
       f.link.gamma_seconds_per_byte > 0 ? 1 / f.link.gamma_seconds_per_byte / 1e9 : 0}};
}

int predict(const Options& o) {
  std::string basis;
  const Figures figures = resolve_figures(o, basis);
  const uint64_t bytes = gradsync::tools::parse_size(o.bytes);
  const auto codec = gradsync::cost_model::parse_wire_codec(o.wire_codec).value();
  gradsync::model::AggregatorFigures aggregators{o.aggregators, figures.link.beta_seconds_per_byte};
  if (o.aggregator_gbps) aggregators.beta_seconds_per_byte = 8 / (*o.aggregator_gbps * 1e9);
  const auto allreduce = gradsync::model::predict_allreduce(o.layout, figures.node, figures.link,
                                                            bytes, codec, aggregators);
  std::optional<gradsync::model::ScalingPrediction> scaling;
  if (o.compute_ms) {
    const uint64_t gradients =
        o.gradient_bytes.empty() ? bytes : gradsync::tools::parse_size(o.gradient_bytes);
    scaling = gradsync::model::predict_scaling(o.layout, figures.node, figures.link,
                                               {*o.compute_ms / 1e3, gradients, o.overlap_fraction},
                                               codec, aggregators);
  }
  if (o.json) {
    json out = {{"nodes", o.layout.nodes},
                {"gpus_per_node", o.layout.ranks_per_node},
                {"bytes", bytes},
                {"wire_codec", o.wire_codec},
                {"aggregators", o.aggregators},
                {"basis", basis},
                {"figures", figures_json(figures)},
                {"picked", allreduce.best().algorithm}};
    for (const auto& p : allreduce.algorithms) {
      out["algorithms"].push_back({{"algorithm", p.algorithm},
                                   {"time_us", p.seconds * 1e6},
                                   {"algbw_gbytes_per_s", p.algbw_gbytes_per_second},
                                   {"busbw_gbytes_per_s", p.busbw_gbytes_per_second}});
    }
    if (scaling) {
      out["scaling"] = {{"communication_ms", scaling->communication_seconds * 1e3},
                        {"step_ms", scaling->step_seconds * 1e3},
                        {"efficiency", scaling->efficiency},
                        {"speedup", scaling->speedup}};
    }
    std::puts(out.dump(2).c_str());
    return 0;
  }
  fmt::print("# gradsync-model: allreduce of {} bytes on {} nodes x {} GPUs ({} ranks)\n", bytes,
             o.layout.nodes, o.layout.ranks_per_node, o.layout.ranks());
  fmt::print("# {}\n", basis);
  if (o.aggregators > 0) {
    fmt::print("# {} aggregators at {:.3g} Gbit/s each\n", o.aggregators,
               8 / aggregators.beta_seconds_per_byte / 1e9);
  }
  fmt::print("# {:>10} {:>12} {:>10} {:>10}\n", "algorithm", "time (us)", "algbw", "busbw");
  fmt::print("# {:>10} {:>12} {:>10} {:>10}\n", "", "", "(GB/s)", "(GB/s)");
  for (size_t i = 0; i < allreduce.algorithms.size(); ++i) {
    const auto& p = allreduce.algorithms[i];
    fmt::print("  {:>10} {:>12.2f} {:>10.3f} {:>10.3f}{}\n", p.algorithm, p.seconds * 1e6,
               p.algbw_gbytes_per_second, p.busbw_gbytes_per_second,
               i == allreduce.picked ? "   <- picked" : "");
  }
  if (scaling) {
    fmt::print("# training step: {:.2f} ms compute, {:.2f} ms allreduce, {:.0f}% of it hidden\n",
               *o.compute_ms, scaling->communication_seconds * 1e3, 100 * o.overlap_fraction);
    fmt::print("  step {:.2f} ms, scaling efficiency {:.1f}%, speedup {:.1f}x over one GPU\n",
               scaling->step_seconds * 1e3, 100 * scaling->efficiency, scaling->speedup);
  }
  return 0;
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"gradsync-model: predicted allreduce time, algbw and busbw of each algorithm"};
  app.set_version_flag("--version", GRADSYNC_VERSION);
  app.add_option("--nodes", o.layout.nodes, "nodes")->check(CLI::PositiveNumber);
  app.add_option("--gpus-per-node", o.layout.ranks_per_node, "GPUs (ranks) per node")
      ->check(CLI::PositiveNumber);
  app.add_option("--bytes", o.bytes, "allreduce size, K/M/G suffixes (default 64M)");
  app.add_option("--link-gbps", o.link_gbps, "inter-node bandwidth per node, Gbit/s")
      ->check(CLI::PositiveNumber);
  app.add_option("--latency-us", o.latency_us, "inter-node one-way latency per message, us")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--calibration", o.calibration,
                 "figures measured by gradsync-bench --calibrate (or a bench/compare result)");
  app.add_option("--overhead-us", o.overhead_us, "fixed cost of one collective on a node, us")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--local-gbytes-per-s", o.local_gbytes_per_second,
                 "bandwidth of the local stages, GB/s")
      ->check(CLI::PositiveNumber);
  app.add_option("--reduce-gbytes-per-s", o.reduce_gbytes_per_second,
                 "reduction bandwidth of the inter-node stage, GB/s")
      ->check(CLI::PositiveNumber);
  app.add_option("--compute-ms", o.compute_ms, "a training step's compute time on one GPU, ms")
      ->check(CLI::PositiveNumber);
  app.add_option("--gradient-bytes", o.gradient_bytes, "the step's gradients (default --bytes)");
  app.add_option("--overlap-fraction", o.overlap_fraction,
                 "fraction of the compute time communication can hide behind (0..1)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--validate", o.validate,
                 "a bench/compare result: predict its gradsync rows, fail beyond --tolerance");
  app.add_option("--tolerance", o.tolerance, "largest relative error --validate accepts")
      ->check(CLI::PositiveNumber);
  app.add_option("--validate-from", o.validate_from,
                 "with --validate: validate only sizes from this one (K/M/G suffixes)");
  app.add_option("--wire-codec", o.wire_codec,
                 "what f32 allreduces send between nodes: none, bf16 (half the bytes), or "
                 "topk:PERCENT (that share of each tensor's chunks)")
      ->check(CLI::Validator(
          [](const std::string& name) {
            return gradsync::cost_model::parse_wire_codec(name)
                       ? std::string()
                       : "must be none, bf16, topk or topk:PERCENT, not '" + name + "'";
          },
          "CODEC"));
  app.add_option("--aggregators", o.aggregators,
                 "aggregators the job sums through (docs/aggregators.md): adds aggregate and split")
      ->check(CLI::Range(0u, 64u));
  app.add_option("--aggregator-gbps", o.aggregator_gbps,
                 "each aggregator's link, Gbit/s (default: as --link-gbps)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json, "JSON instead of a table");
  CLI11_PARSE(app, argc, argv);
  if (!o.validate.empty()) {
    return gradsync::model::validate(o.validate, o.calibration, o.tolerance,
                                     gradsync::tools::parse_size(o.validate_from), o.json);
  }
  return predict(o);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradsync-model: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "gradsync-model: unknown error\n");
    return 1;
  }
}
