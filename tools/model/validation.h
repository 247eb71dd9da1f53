// The model against measurements: a bench/compare result holds gradsync's timings of one
// layout and the calibration run made beside them; the model, fitted to a calibration, predicts
// every measured size, and a prediction further than the tolerance from its measurement fails.
//
// The model is an α-β-γ model: it holds where one of its terms dominates. Between the two
// regimes the transport changes protocols (contributions stop piggybacking on the negotiation,
// UCX switches from eager sends to rendezvous, the pipeline fills), each with round trips of
// its own that no α-β-γ term describes; those sizes are predicted and shown, not validated.
#pragma once

#include "tools/model/calibration.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace gradsync::model {

enum class Regime {
  kLatency,     // up to kEagerMinBytes: one negotiation message always carries the data
  kTransition,  // not validated
  kBandwidth,   // the pipeline runs full (four pieces), and the data fits no cache
};
Regime regime_of(uint64_t bytes, uint64_t last_level_cache_bytes);
const char* regime_name(Regime regime);

struct ValidationRow {
  uint64_t bytes = 0;
  double measured_seconds = 0;
  double predicted_seconds = 0;
  Regime regime = Regime::kTransition;
  double relative_error() const { return predicted_seconds / measured_seconds - 1; }
  bool validated() const { return regime != Regime::kTransition; }
};

// Predicts each of `result`'s rows of `system` on its layout ("layout",
// "systems.<system>.rows"), its allreduces sending what `codec` says.
std::vector<ValidationRow> predict_measurements(const Figures& figures,
                                                uint64_t last_level_cache_bytes,
                                                const nlohmann::json& result,
                                                const std::string& system = "gradsync",
                                                const WireCodecSpec& codec = {});

// gradsync-model --validate: the rows of the result at `result_path` against the model fitted
// to `calibration_path` (empty: the result's own calibration), and its top-k rows where the
// calibration timed the codec. Prints them; returns the exit status (0: every validated row
// within `tolerance`).
// Rows under `from_bytes` are shown, not validated.
int validate(const std::string& result_path, const std::string& calibration_path, double tolerance,
             uint64_t from_bytes, bool json);

}  // namespace gradsync::model
