#include "cost_model/cost_model.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdint>

namespace gradsync::cost_model {

bool eager_bulk_pays(const LinkFigures& link) {
  return link.beta_seconds_per_byte > 0 && link.gamma_seconds_per_byte > 0 &&
         link.beta_seconds_per_byte >= kEagerBulkMinWireOverReduce * link.gamma_seconds_per_byte;
}

std::optional<AllreduceAlgorithm> parse_algorithm(std::string_view name) {
  if (name == "ring") return AllreduceAlgorithm::kRing;
  if (name == "rhd") return AllreduceAlgorithm::kHalvingDoubling;
  if (name == "aggregate") return AllreduceAlgorithm::kAggregate;
  if (name == "split") return AllreduceAlgorithm::kSplit;
  if (name == "direct") return AllreduceAlgorithm::kDirect;
  return std::nullopt;
}

const char* algorithm_name(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kHalvingDoubling:
      return "rhd";
    case AllreduceAlgorithm::kAggregate:
      return "aggregate";
    case AllreduceAlgorithm::kSplit:
      return "split";
    case AllreduceAlgorithm::kDirect:
      return "direct";
    case AllreduceAlgorithm::kRing:
      break;
  }
  return "ring";
}

std::optional<WireCodecSpec> parse_wire_codec(std::string_view name) {
  if (name == "none") return WireCodecSpec{};
  if (name == "bf16") return WireCodecSpec{WireCodec::kBf16};
  constexpr std::string_view kTopK = "topk";
  if (!name.starts_with(kTopK)) return std::nullopt;
  WireCodecSpec spec{WireCodec::kTopK};
  name.remove_prefix(kTopK.size());
  if (name.empty()) return spec;
  if (name.front() != ':') return std::nullopt;
  name.remove_prefix(1);
  double percent = 0;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), percent);
  if (error != std::errc{} || end != name.data() + name.size() || !(percent > 0) || percent > 100) {
    return std::nullopt;
  }
  spec.topk_percent = percent;
  return spec;
}

std::string wire_codec_name(const WireCodecSpec& spec) {
  if (spec.codec != WireCodec::kTopK) return wire_codec_name(spec.codec);
  char percent[32];  // the shortest text that reads back as the same double
  const auto end = std::to_chars(percent, percent + sizeof(percent), spec.topk_percent).ptr;
  return "topk:" + std::string(percent, end);
}

const char* wire_codec_name(WireCodec codec) {
  switch (codec) {
    case WireCodec::kBf16:
      return "bf16";
    case WireCodec::kTopK:
      return "topk";
    case WireCodec::kNone:
      break;
  }
  return "none";
}

double predict_ring(const LinkFigures& link, uint32_t nodes, uint64_t bytes, WireCodec codec) {
  if (nodes <= 1) return 0;
  const double n = nodes;
  const double slice = static_cast<double>(bytes) / n;
  const bool bf16 = codec == WireCodec::kBf16;
  const double wire_slice = bf16 ? slice / 2 : slice;
  const double codec_passes = bf16 ? 3 * n - 2 : 0;
  return 2 * (n - 1) * (link.alpha_seconds + wire_slice * link.beta_seconds_per_byte) +
         (n - 1 + codec_passes / 2) * slice * link.gamma_seconds_per_byte;
}

double predict_halving_doubling(const LinkFigures& link, uint32_t nodes, uint64_t bytes) {
  if (nodes <= 1) return 0;
  const uint32_t p = std::bit_floor(nodes);
  const double steps = std::countr_zero(p);
  const double s = static_cast<double>(bytes);
  const double fraction = (p - 1.0) / p;
  double time = 2 * steps * link.alpha_seconds + 2 * fraction * s * link.beta_seconds_per_byte +
                fraction * s * link.gamma_seconds_per_byte;
  if (nodes != p) {
    // Fold in before, hand the result back after: two full-size messages and one reduction.
    time +=
        2 * (link.alpha_seconds + s * link.beta_seconds_per_byte) + s * link.gamma_seconds_per_byte;
  }
  return time;
}

double predict_direct(const LinkFigures& link, uint32_t nodes, uint64_t bytes) {
  if (nodes <= 1) return 0;
  const double fraction = (nodes - 1.0) / nodes;
  const double s = static_cast<double>(bytes);
  return 2 * (nodes - 1.0) * link.alpha_seconds + 2 * fraction * s * link.beta_seconds_per_byte +
         fraction * s * link.gamma_seconds_per_byte;
}

double predict_aggregate(const LinkFigures& link, uint32_t nodes,
                         const AggregatorFigures& aggregators, uint64_t bytes, double share) {
  if (nodes <= 1 || aggregators.count == 0) return 0;
  const double n = nodes;
  const double s = static_cast<double>(bytes);
  const double ring_factor = 2 * (n - 1) / n;
  const double node_link = (share + (1 - share) * ring_factor) * s * link.beta_seconds_per_byte;
  const double per_aggregator = share * s * n / aggregators.count;
  const double aggregator_link =
      per_aggregator * (aggregators.beta_seconds_per_byte + link.gamma_seconds_per_byte);
  const double ring_messages = share < 1 ? 2 * (n - 1) * link.alpha_seconds : 0;
  return std::max(2 * link.alpha_seconds, ring_messages) + std::max(node_link, aggregator_link);
}

double aggregated_share(uint32_t nodes, const LinkFigures& link,
                        const AggregatorFigures& aggregators) {
  if (nodes <= 2 || aggregators.count == 0) return 1;
  const double n = nodes;
  const double ring_factor = 2 * (n - 1) / n;
  // Node link: β(r - x(r - 1)); aggregator link: x n (β_a + γ) / k. Equal at x:
  const double per_aggregator =
      n * (aggregators.beta_seconds_per_byte + link.gamma_seconds_per_byte) / aggregators.count;
  const double denominator = (ring_factor - 1) * link.beta_seconds_per_byte + per_aggregator;
  if (denominator <= 0) return 1;
  return std::clamp(ring_factor * link.beta_seconds_per_byte / denominator, 0.0, 1.0);
}

double predict_allreduce(AllreduceAlgorithm algorithm, const LinkFigures& link, uint32_t nodes,
                         uint64_t bytes, WireCodec codec, const AggregatorFigures& aggregators) {
  // The codec halves what the aggregators' pushes and sums carry, as the ring's pieces.
  const uint64_t wire = codec == WireCodec::kBf16 ? bytes / 2 : bytes;
  switch (algorithm) {
    case AllreduceAlgorithm::kRing:
      return predict_ring(link, nodes, bytes, codec);
    case AllreduceAlgorithm::kHalvingDoubling:
      return predict_halving_doubling(link, nodes, bytes);
    case AllreduceAlgorithm::kDirect:
      return predict_direct(link, nodes, bytes);
    case AllreduceAlgorithm::kAggregate:
      return predict_aggregate(link, nodes, aggregators, wire);
    case AllreduceAlgorithm::kSplit:
      return predict_aggregate(link, nodes, aggregators, wire,
                               aggregated_share(nodes, link, aggregators));
  }
  return 0;
}

std::optional<double> implied_beta(AllreduceAlgorithm algorithm, const LinkFigures& link,
                                   uint32_t nodes, uint64_t bytes, WireCodec codec,
                                   double seconds) {
  // Every prediction is linear in β: fixed + per_beta * β.
  LinkFigures without_wire = link;
  without_wire.beta_seconds_per_byte = 0;
  const double fixed = predict_allreduce(algorithm, without_wire, nodes, bytes, codec);
  LinkFigures unit_wire = link;
  unit_wire.beta_seconds_per_byte = 1;
  const double per_beta = predict_allreduce(algorithm, unit_wire, nodes, bytes, codec) - fixed;
  if (per_beta <= 0 || seconds <= fixed) return std::nullopt;
  return (seconds - fixed) / per_beta;
}

AllreduceAlgorithm choose_allreduce(const LinkFigures& link, uint32_t nodes, uint64_t bytes,
                                    WireCodec codec, const AggregatorFigures& aggregators) {
  AllreduceAlgorithm best =
      predict_halving_doubling(link, nodes, bytes) < predict_ring(link, nodes, bytes, codec)
          ? AllreduceAlgorithm::kHalvingDoubling
          : AllreduceAlgorithm::kRing;
  if (aggregators.count == 0 || link.beta_seconds_per_byte <= 0) return best;
  double best_seconds = predict_allreduce(best, link, nodes, bytes, codec);
  const double share = aggregated_share(nodes, link, aggregators);
  for (const auto candidate : {AllreduceAlgorithm::kAggregate, AllreduceAlgorithm::kSplit}) {
    // A split that sends everything one way is the one algorithm, or the other.
    if (candidate == AllreduceAlgorithm::kSplit && share >= 1) continue;
    const double seconds = predict_allreduce(candidate, link, nodes, bytes, codec, aggregators);
    if (seconds < best_seconds) {
      best = candidate;
      best_seconds = seconds;
    }
  }
  return best;
}

double predict_cheaper(const LinkFigures& link, uint32_t nodes, uint64_t bytes) {
  return std::min(predict_ring(link, nodes, bytes), predict_halving_doubling(link, nodes, bytes));
}

const char* broadcast_algorithm_name(BroadcastAlgorithm algorithm) {
  return algorithm == BroadcastAlgorithm::kChain ? "chain" : "direct";
}

uint32_t chain_broadcast_pieces(uint64_t bytes) {
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(bytes / kPipelinePieceBytes, 1, kMaxBroadcastPieces));
}

double predict_broadcast(BroadcastAlgorithm algorithm, const LinkFigures& link, uint32_t nodes,
                         uint64_t bytes) {
  if (nodes <= 1) return 0;
  const double wire = link.beta_seconds_per_byte * static_cast<double>(bytes);
  if (algorithm == BroadcastAlgorithm::kDirect) return link.alpha_seconds + (nodes - 1.0) * wire;
  const double pieces = chain_broadcast_pieces(bytes);
  return (pieces + nodes - 2.0) * (link.alpha_seconds + wire / pieces);
}

BroadcastAlgorithm choose_broadcast(const LinkFigures& link, uint32_t nodes, uint64_t bytes) {
  return predict_broadcast(BroadcastAlgorithm::kChain, link, nodes, bytes) <
                 predict_broadcast(BroadcastAlgorithm::kDirect, link, nodes, bytes)
             ? BroadcastAlgorithm::kChain
             : BroadcastAlgorithm::kDirect;
}

uint64_t fusion_cutoff_bytes(const LinkFigures& link, uint32_t nodes) {
  const double saved = predict_cheaper(link, nodes, 0);
  const double copy_cost = 2 * link.gamma_seconds_per_byte;
  if (copy_cost <= 0) return UINT64_MAX;
  return static_cast<uint64_t>(std::min(saved / copy_cost, 0x1p62));
}

uint64_t eager_max_bytes(const LinkFigures& link, uint32_t nodes) {
  if (nodes <= 1 || link.alpha_seconds <= 0) return kEagerMinBytes;
  const double per_byte =
      (nodes - 1.0) * (link.beta_seconds_per_byte + link.gamma_seconds_per_byte);
  for (uint64_t bytes = kEagerCapBytes; bytes > kEagerMinBytes; bytes /= 2) {
    const double separate = predict_cheaper(link, nodes, bytes);
    if (per_byte * static_cast<double>(bytes) < separate) return bytes;
  }
  return kEagerMinBytes;
}

}  // namespace gradsync::cost_model
