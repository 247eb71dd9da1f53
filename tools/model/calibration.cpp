#include "tools/model/calibration.h"

#include "cost_model/cost_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <stdexcept>

namespace gradsync::model {
namespace {

using nlohmann::json;

// The smallest per-byte cost a fit may give a stage: a fit that comes out at or below zero
// (noise in the two timings) means "not measurable next to the other stages".
constexpr double kNegligibleSecondsPerByte = 1e-15;

double number(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number() || it->get<double>() < 0) {
    throw std::invalid_argument(where + ": '" + key + "' must be a non-negative number");
  }
  return it->get<double>();
}

const json& member(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_object()) {
    throw std::invalid_argument(where + ": '" + key + "' must be an object");
  }
  return *it;
}

json pair_json(const TimedPair& pair) {
  return {{"small_us", pair.small_seconds * 1e6}, {"large_us", pair.large_seconds * 1e6}};
}

TimedPair pair_from(const json& object, const std::string& where) {
  return {number(object, "small_us", where) / 1e6, number(object, "large_us", where) / 1e6};
}

}  // namespace

Figures fit_figures(const CalibrationRun& run) {
  const double k = run.layout.ranks_per_node;
  const double large = static_cast<double>(run.large_bytes);
  const double local_growth = run.local.large_seconds - run.local.small_seconds;
  if (run.large_bytes <= kCalibrationSmallBytes || local_growth <= 0) {
    throw std::invalid_argument(
        "calibration: the large allreduce on one node was no slower than the small one");
  }
  if (run.reduce_bytes_per_second <= 0) {
    throw std::invalid_argument("calibration: no reduction bandwidth was measured");
  }
  Figures figures;
  figures.node.overhead_seconds = run.local.small_seconds;
  figures.node.local_bytes_per_second = 2 * k * large / local_growth;
  figures.link.gamma_seconds_per_byte = 1 / run.reduce_bytes_per_second;
  if (!run.cluster || run.layout.nodes < 2) return figures;

  const double n = run.layout.nodes;
  const double steps = 2 * (n - 1);  // the ring's, forced for the calibration
  figures.link.alpha_seconds =
      std::max(0.0, (run.cluster->small_seconds - run.local.small_seconds) / steps);
  // A large run across the nodes, less the small one, is the local stages' bytes (which cost
  // what they cost on one node) and the algorithm's messages, bytes on the wire and bytes
  // reduced, less the ring's messages that the small run paid; its algorithm's β follows.
  const double local_large = 2 * k * large / figures.node.local_bytes_per_second;
  auto beta_of = [&](cost_model::AllreduceAlgorithm algorithm, double large_seconds) {
    const double network = large_seconds - run.cluster->small_seconds +
                           steps * figures.link.alpha_seconds - local_large;
    return std::max(kNegligibleSecondsPerByte,
                    cost_model::implied_beta(algorithm, figures.link, run.layout.nodes,
                                             run.large_bytes, cost_model::WireCodec::kNone, network)
                        .value_or(0));
  };
  figures.link.beta_seconds_per_byte =
      beta_of(cost_model::AllreduceAlgorithm::kRing, run.cluster->large_seconds);
  if (run.cluster_halving_doubling_large_seconds) {
    figures.link.beta_seconds_per_byte =
        std::min(figures.link.beta_seconds_per_byte,
                 beta_of(cost_model::AllreduceAlgorithm::kHalvingDoubling,
                         *run.cluster_halving_doubling_large_seconds));
  }
  if (run.cluster_topk_large_seconds) {
    const double passes = *run.cluster_topk_large_seconds -
                          topk_fixed_seconds(run.layout, figures.node, figures.link,
                                             run.large_bytes, kCalibrationTopKPercent);
    figures.node.topk_pass_seconds_per_byte = std::max(kNegligibleSecondsPerByte, passes / large);
  }
  return figures;
}

nlohmann::json to_json(const CalibrationRun& run) {
  json out = {
      {"kind", "gradsync-calibration"},
      {"layout", {{"nodes", run.layout.nodes}, {"ranks_per_node", run.layout.ranks_per_node}}},
      {"memory",
       {{"copy_gbytes_per_s", run.copy_bytes_per_second / 1e9},
        {"reduce_gbytes_per_s", run.reduce_bytes_per_second / 1e9}}},
      {"small_bytes", kCalibrationSmallBytes},
      {"large_bytes", run.large_bytes},
      {"local", pair_json(run.local)}};
  if (run.cluster) out["cluster"] = pair_json(*run.cluster);
  if (run.cluster && run.cluster_halving_doubling_large_seconds) {
    out["cluster"]["halving_doubling_large_us"] = *run.cluster_halving_doubling_large_seconds * 1e6;
  }
  if (run.cluster && run.cluster_topk_large_seconds) {
    out["cluster"]["topk_large_us"] = *run.cluster_topk_large_seconds * 1e6;
    out["cluster"]["topk_percent"] = kCalibrationTopKPercent;
  }
  return out;
}

CalibrationRun calibration_from_json(const nlohmann::json& in) {
  if (!in.is_object() || in.value("kind", "") != "gradsync-calibration") {
    throw std::invalid_argument(
        "not a gradsync calibration (no \"kind\": \"gradsync-calibration\")");
  }
  CalibrationRun run;
  const json& layout = member(in, "layout", "calibration");
  run.layout.nodes = static_cast<uint32_t>(number(layout, "nodes", "calibration.layout"));
  run.layout.ranks_per_node =
      static_cast<uint32_t>(number(layout, "ranks_per_node", "calibration.layout"));
  if (run.layout.nodes == 0 || run.layout.ranks_per_node == 0) {
    throw std::invalid_argument("calibration.layout: nodes and ranks_per_node must be positive");
  }
  const json& memory = member(in, "memory", "calibration");
  run.copy_bytes_per_second = number(memory, "copy_gbytes_per_s", "calibration.memory") * 1e9;
  run.reduce_bytes_per_second = number(memory, "reduce_gbytes_per_s", "calibration.memory") * 1e9;
  if (memory.contains("last_level_cache_bytes")) {
    run.last_level_cache_bytes =
        static_cast<uint64_t>(number(memory, "last_level_cache_bytes", "calibration.memory"));
  }
  run.large_bytes = static_cast<uint64_t>(number(in, "large_bytes", "calibration"));
  run.local = pair_from(member(in, "local", "calibration"), "calibration.local");
  if (in.contains("cluster")) {
    const json& cluster = member(in, "cluster", "calibration");
    run.cluster = pair_from(cluster, "calibration.cluster");
    if (cluster.contains("halving_doubling_large_us")) {
      run.cluster_halving_doubling_large_seconds =
          number(cluster, "halving_doubling_large_us", "calibration.cluster") / 1e6;
    }
    if (cluster.contains("topk_large_us")) {
      if (number(cluster, "topk_percent", "calibration.cluster") != kCalibrationTopKPercent) {
        throw std::invalid_argument("calibration.cluster: top-k timed at another percent");
      }
      run.cluster_topk_large_seconds =
          number(cluster, "topk_large_us", "calibration.cluster") / 1e6;
    }
  } else if (run.layout.nodes > 1) {
    throw std::invalid_argument("calibration: a run on several nodes needs 'cluster'");
  }
  return run;
}

CalibrationRun load_calibration(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::invalid_argument("cannot read " + path);
  try {
    const json in = json::parse(file);
    return calibration_from_json(in.contains("calibration") ? in.at("calibration") : in);
  } catch (const json::exception& e) {
    throw std::invalid_argument(path + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

}  // namespace gradsync::model
