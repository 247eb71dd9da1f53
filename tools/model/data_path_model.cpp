#include "tools/model/data_path_model.h"

#include <algorithm>
#include <stdexcept>

namespace gradsync::model {
namespace {

double local_seconds(const Layout& layout, const NodeFigures& node, uint64_t bytes) {
  if (node.local_bytes_per_second <= 0) {
    throw std::invalid_argument("the local stage's bandwidth must be positive");
  }
  const double traffic =
      2.0 * static_cast<double>(bytes) * (node.local_per_device ? 1.0 : layout.ranks_per_node);
  return traffic / node.local_bytes_per_second;
}

// Two pipelined stages of `local` and `network` seconds over `bytes`.
double pipelined(const NodeFigures& node, double local, double network, uint64_t bytes) {
  if (!node.stages_overlap) return local + network;
  // The slower stage sets the pace; the other shows only for the first piece (all of it when
  // the collective is one piece).
  const double first_piece =
      std::min(1.0, static_cast<double>(kPipelinePieceBytes) / static_cast<double>(bytes));
  return std::max(local, network) + std::min(local, network) * first_piece;
}

Prediction make_prediction(const Layout& layout, std::string algorithm, double seconds,
                           uint64_t bytes) {
  Prediction p{std::move(algorithm), seconds, 0, 0};
  if (seconds > 0) p.algbw_gbytes_per_second = static_cast<double>(bytes) / seconds / 1e9;
  const double n = layout.ranks();
  p.busbw_gbytes_per_second = p.algbw_gbytes_per_second * 2 * (n - 1) / n;
  return p;
}

}  // namespace

double topk_fixed_seconds(const Layout& layout, const NodeFigures& node, const LinkFigures& link,
                          uint64_t bytes, double percent) {
  auto cheaper = [&](uint64_t b) { return cost_model::predict_cheaper(link, layout.nodes, b); };
  const uint64_t chunk_bytes = cost_model::kTopKChunkElements * 4;
  const uint64_t energies = (bytes + chunk_bytes - 1) / chunk_bytes * 4;
  const auto chosen =
      static_cast<uint64_t>(std::min(1.0, percent / 100) * static_cast<double>(bytes));
  return node.overhead_seconds + cheaper(energies) +
         cheaper(std::min(bytes, std::max(chosen, chunk_bytes)));
}

double topk_passes(const Layout& layout, const NodeFigures& node, uint64_t bytes) {
  const double s = static_cast<double>(bytes);
  if (node.topk_pass_seconds_per_byte > 0) return s * node.topk_pass_seconds_per_byte;
  // The local stages, the pass through the held-back buffer (3S) and the result's zeros (S).
  return local_seconds(layout, node, bytes) + 4.0 * s / node.local_bytes_per_second;
}

AllreducePrediction predict_allreduce(const Layout& layout, const NodeFigures& node,
                                      const LinkFigures& link, uint64_t bytes,
                                      const WireCodecSpec& spec,
                                      const AggregatorFigures& aggregators) {
  if (layout.nodes == 0 || layout.ranks_per_node == 0) {
    throw std::invalid_argument("a layout needs at least one node and one rank per node");
  }
  if (bytes == 0) throw std::invalid_argument("an allreduce of 0 bytes costs nothing to model");
  const double local = local_seconds(layout, node, bytes);
  AllreducePrediction out;
  if (layout.nodes == 1) {
    out.algorithms.push_back(
        make_prediction(layout, "local", node.overhead_seconds + local, bytes));
    return out;
  }
  const WireCodec codec = spec.codec;
  const double ring = cost_model::predict_ring(link, layout.nodes, bytes, codec);
  const double rhd = cost_model::predict_halving_doubling(link, layout.nodes, bytes);
  out.algorithms.push_back(
      make_prediction(layout, codec == WireCodec::kBf16 ? "ring+bf16" : "ring",
                      node.overhead_seconds + pipelined(node, local, ring, bytes), bytes));
  out.algorithms.push_back(make_prediction(
      layout, "rhd", node.overhead_seconds + pipelined(node, local, rhd, bytes), bytes));
  const auto chosen = cost_model::choose_allreduce(link, layout.nodes, bytes, codec, aggregators);
  out.picked = chosen == cost_model::AllreduceAlgorithm::kRing ? 0 : 1;
  if (aggregators.count > 0 && codec != WireCodec::kTopK) {
    // The aggregators' chunks stream as the ring's pieces do: the local stages overlap them.
    for (const auto algorithm :
         {cost_model::AllreduceAlgorithm::kAggregate, cost_model::AllreduceAlgorithm::kSplit}) {
      const double wire =
          cost_model::predict_allreduce(algorithm, link, layout.nodes, bytes, codec, aggregators);
      std::string name = cost_model::algorithm_name(algorithm);
      if (codec == WireCodec::kBf16) name += "+bf16";
      if (chosen == algorithm) out.picked = out.algorithms.size();
      out.algorithms.push_back(make_prediction(
          layout, name, node.overhead_seconds + pipelined(node, local, wire, bytes), bytes));
    }
  }
  if (codec == WireCodec::kTopK) {
    // An allreduce small enough to piggyback on the negotiation stays exact (negotiator.h).
    const double seconds = bytes <= cost_model::eager_max_bytes(link, layout.nodes)
                               ? out.best().seconds
                               : topk_fixed_seconds(layout, node, link, bytes, spec.topk_percent) +
                                     topk_passes(layout, node, bytes);
    out.algorithms.push_back(
        make_prediction(layout, cost_model::wire_codec_name(spec), seconds, bytes));
    out.picked = 2;  // the daemons run every f32 sum through it
  }
  return out;
}

ScalingPrediction predict_scaling(const Layout& layout, const NodeFigures& node,
                                  const LinkFigures& link, const TrainingStep& step,
                                  const WireCodecSpec& codec,
                                  const AggregatorFigures& aggregators) {
  if (step.compute_seconds <= 0) throw std::invalid_argument("the compute time must be positive");
  if (step.overlap_fraction < 0 || step.overlap_fraction > 1) {
    throw std::invalid_argument("the overlap fraction lies between 0 and 1");
  }
  ScalingPrediction out;
  out.communication_seconds =
      layout.ranks() > 1
          ? predict_allreduce(layout, node, link, step.gradient_bytes, codec, aggregators)
                .best()
                .seconds
          : 0;
  const double hidden = step.overlap_fraction * step.compute_seconds;
  out.step_seconds = step.compute_seconds + std::max(0.0, out.communication_seconds - hidden);
  out.efficiency = step.compute_seconds / out.step_seconds;
  out.speedup = layout.ranks() * out.efficiency;
  return out;
}

}  // namespace gradsync::model
