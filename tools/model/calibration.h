// What `gradsync-bench --calibrate` measures on a cluster, and the model figures that follow
// from it. The run times gradsync's own collectives, each at two sizes: once among one node's
// ranks (the fixed cost of a collective and the bandwidth of the local stages), and once
// across the nodes with the ring forced (what the links add per step and per byte), the large
// size again with halving-doubling forced, and again with the top-k wire codec at
// kCalibrationTopKPercent (what its passes over the data cost beside its two allreduces). Fitting
// the model's terms to gradsync's own timings, rather than to a raw transport test, keeps in them
// what a transport test leaves out: the daemon's copies, and the cores the stages share.
#pragma once

#include "tools/model/data_path_model.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace gradsync::model {

struct TimedPair {
  double small_seconds = 0;  // an allreduce of kCalibrationSmallBytes
  double large_seconds = 0;  // an allreduce of CalibrationRun::large_bytes
};

inline constexpr uint64_t kCalibrationSmallBytes = 8;
inline constexpr double kCalibrationTopKPercent = 1;

struct CalibrationRun {
  Layout layout;
  // On every core at once, out of cache: memcpy (the memory ceiling), and a two-input f32 sum
  // per output byte.
  double copy_bytes_per_second = 0;
  double reduce_bytes_per_second = 0;
  // Where collectives stop fitting the caches (0: unknown): the model's bandwidth regime.
  uint64_t last_level_cache_bytes = 0;
  uint64_t large_bytes = 0;
  TimedPair local;                   // among one node's ranks
  std::optional<TimedPair> cluster;  // across the nodes (ring); absent on one node
  // The large allreduce across the nodes by halving-doubling; absent on one node, and in
  // calibrations older than it.
  std::optional<double> cluster_halving_doubling_large_seconds;
  // The large allreduce across the nodes with the top-k codec at kCalibrationTopKPercent;
  // absent on one node, and in calibrations older than it.
  std::optional<double> cluster_topk_large_seconds;
};

struct Figures {
  NodeFigures node;
  LinkFigures link;
};

// The model's figures for the host path of the machine the run measured. The links' β is the
// smaller of what the ring's and halving-doubling's large runs imply, each by its own bytes
// on the wire: the daemons run the cheaper of the two, and what makes the other slower (its
// messages' rendezvous and wake-ups on shared cores) is no property of the wire. Throws
// std::invalid_argument when the run's timings cannot be fitted (a large allreduce no slower
// than a small one). With a top-k run, the codec's passes cost per byte what that run took
// beyond its two allreduces and a collective's fixed cost.
Figures fit_figures(const CalibrationRun& run);

nlohmann::json to_json(const CalibrationRun& run);
// Throws std::invalid_argument naming the missing or bad field.
CalibrationRun calibration_from_json(const nlohmann::json& json);
// Reads a file that is either a calibration or a bench/compare result holding one under
// "calibration".
CalibrationRun load_calibration(const std::string& path);

}  // namespace gradsync::model
