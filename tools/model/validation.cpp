#include "tools/model/validation.h"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace gradsync::model {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::invalid_argument("cannot read " + path);
  try {
    return json::parse(file);
  } catch (const json::exception& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

}  // namespace

Regime regime_of(uint64_t bytes, uint64_t last_level_cache_bytes) {
  if (bytes <= cost_model::kEagerMinBytes) return Regime::kLatency;
  if (bytes >= std::max<uint64_t>(4 * cost_model::kPipelinePieceBytes, last_level_cache_bytes)) {
    return Regime::kBandwidth;
  }
  return Regime::kTransition;
}

const char* regime_name(Regime regime) {
  switch (regime) {
    case Regime::kLatency:
      return "latency";
    case Regime::kTransition:
      return "transition";
    case Regime::kBandwidth:
      return "bandwidth";
  }
  return "?";
}

std::vector<ValidationRow> predict_measurements(const Figures& figures,
                                                uint64_t last_level_cache_bytes, const json& result,
                                                const std::string& system,
                                                const WireCodecSpec& codec) {
  const Layout layout{result.at("layout").at("nodes").get<uint32_t>(),
                      result.at("layout").at("ranks_per_node").get<uint32_t>()};
  std::vector<ValidationRow> rows;
  for (const json& row : result.at("systems").at(system).at("rows")) {
    ValidationRow out;
    out.bytes = row.at("bytes").get<uint64_t>();
    out.measured_seconds = row.at("time_us").get<double>() / 1e6;
    out.regime = regime_of(out.bytes, last_level_cache_bytes);
    out.predicted_seconds =
        predict_allreduce(layout, figures.node, figures.link, out.bytes, codec).best().seconds;
    rows.push_back(out);
  }
  return rows;
}

namespace {

// Prints `rows` (or appends them to `out`); false when a validated one is beyond `tolerance`.
bool report_rows(const std::vector<ValidationRow>& rows, double tolerance, json* out) {
  bool within = true;
  for (const ValidationRow& row : rows) {
    const bool ok = !row.validated() || std::abs(row.relative_error()) <= tolerance;
    within = within && ok;
    const char* regime = regime_name(row.regime);
    if (out != nullptr) {
      out->push_back({{"bytes", row.bytes},
                      {"measured_us", row.measured_seconds * 1e6},
                      {"predicted_us", row.predicted_seconds * 1e6},
                      {"relative_error", row.relative_error()},
                      {"regime", regime},
                      {"validated", row.validated()}});
    } else {
      fmt::print("  {:>10} {:>10.1f}us {:>10.1f}us {:>+7.1f}%  {}{}\n", row.bytes,
                 row.measured_seconds * 1e6, row.predicted_seconds * 1e6,
                 100 * row.relative_error(), regime,
                 !row.validated() ? " (not validated)"
                 : ok             ? ""
                                  : "   <- beyond tolerance");
    }
  }
  return within;
}

}  // namespace

int validate(const std::string& result_path, const std::string& calibration_path, double tolerance,
             uint64_t from_bytes, bool as_json) {
  const json result = read_json(result_path);
  const std::string source = calibration_path.empty() ? result_path : calibration_path;
  const CalibrationRun calibration = load_calibration(source);
  const Figures figures = fit_figures(calibration);
  // The top-k rows too, where the calibration timed the codec's passes (older files did not)
  // and the result ran it at the calibrated percent.
  const WireCodecSpec topk{WireCodec::kTopK, kCalibrationTopKPercent};
  const bool with_topk = calibration.cluster_topk_large_seconds && result.contains("systems") &&
                         result["systems"].contains("gradsync_topk") &&
                         result.value("topk_codec", "") == cost_model::wire_codec_name(topk);
  std::vector<ValidationRow> rows;
  std::vector<ValidationRow> topk_rows;
  try {
    rows = predict_measurements(figures, calibration.last_level_cache_bytes, result);
    if (with_topk) {
      topk_rows = predict_measurements(figures, calibration.last_level_cache_bytes, result,
                                       "gradsync_topk", topk);
    }
    for (auto* set : {&rows, &topk_rows}) {
      for (ValidationRow& row : *set) {
        if (row.bytes < from_bytes) row.regime = Regime::kTransition;
      }
    }
  } catch (const json::exception& e) {
    throw std::invalid_argument(result_path + ": not a bench/compare result: " + e.what());
  }
  bool within = std::any_of(rows.begin(), rows.end(), [](const auto& r) { return r.validated(); });
  json out = json::array();
  if (!as_json) {
    fmt::print("# {} against the model fitted to {} (tolerance {:.0f}%)\n", result_path, source,
               100 * tolerance);
    fmt::print("# {:>10} {:>12} {:>12} {:>8}  {}\n", "size (B)", "measured", "predicted", "error",
               "regime");
  }
  within = report_rows(rows, tolerance, as_json ? &out : nullptr) && within;
  if (with_topk) {
    // Printed, not in the JSON: bench/compare keeps the exact rows' predictions only.
    if (!as_json) fmt::print("# with the {} wire codec\n", cost_model::wire_codec_name(topk));
    json ignored = json::array();
    within = report_rows(topk_rows, tolerance, as_json ? &ignored : nullptr) && within;
  }
  if (as_json) std::puts(out.dump(2).c_str());
  if (!within)
    std::fprintf(stderr, "gradsync-model: predictions beyond %.0f%% of the measurements\n",
                 100 * tolerance);
  return within ? 0 : 1;
}

}  // namespace gradsync::model
