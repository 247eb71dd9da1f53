// The α-β-γ cost model of gradsync's whole allreduce data path, for gradsync-model: what a
// collective of S bytes costs on N nodes with K ranks (GPUs) each, stage by stage.
//
//   overhead   one collective's fixed cost on a node: submission, negotiation, completion;
//   local      the node's ranks' buffers read and written: reduced on the way out, the result
//              copied back (2S bytes of traffic per rank);
//   inter-node ring or recursive halving-doubling among the N node daemons, exactly as the
//              daemons' own chooser predicts it (cost_model/cost_model.h);
//   codec      with the bf16 wire codec, the ring's bytes on the wire halve and its encode
//              and decode passes are added, as the daemons' chooser prices them. With top-k
//              at P%, the codec's passes over the data (as a calibration timed them, or the
//              local stages, a pass through the held-back buffer and the result's zeros at
//              the local stages' bandwidth) and two allreduces, one after the other, each
//              by the cheaper algorithm: the chunk energies (4 bytes per 32 KiB chunk) and
//              the chosen chunks (P% of S); nothing overlaps. An allreduce small enough to
//              piggyback on the negotiation stays exact.
//
// The stages are pipelined in pieces. Where they run on separate engines (a GPU's copy and
// compute units beside the NIC) they overlap, and the slower stage sets the pace; where they
// share the host's cores (gradsync's host path) their costs add.
#pragma once

#include "cost_model/cost_model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace gradsync::model {

struct Layout {
  uint32_t nodes = 1;
  uint32_t ranks_per_node = 1;  // GPUs per node, or host ranks
  uint32_t ranks() const { return nodes * ranks_per_node; }
};

// What one node does, apart from its links.
struct NodeFigures {
  double overhead_seconds = 0;  // per collective
  double local_bytes_per_second = 0;
  // GPUs: every device moves its own 2S (they work in parallel). Host: the node's memory
  // moves every rank's 2S.
  bool local_per_device = false;
  bool stages_overlap = false;
  // The top-k codec's passes over a tensor (its local sums into the held-back values, the
  // choice, the result's zeros), per byte of it, as a calibration timed them; 0: priced from
  // the local stages' bandwidth instead.
  double topk_pass_seconds_per_byte = 0;
};

// The network between nodes; gamma is the reduction of what arrives.
using LinkFigures = cost_model::LinkFigures;

struct Prediction {
  // "local" (one node), "ring" ("ring+bf16" with the codec), "rhd", "topk:P" (the codec)
  std::string algorithm;
  double seconds = 0;
  double algbw_gbytes_per_second = 0;  // S / time
  double busbw_gbytes_per_second = 0;  // nccl-tests: algbw * 2(n-1)/n over all ranks
};

struct AllreducePrediction {
  // One on one node; ring and rhd across nodes, top-k with that codec, aggregate and split
  // with aggregators.
  std::vector<Prediction> algorithms;
  size_t picked = 0;  // the one the daemons would run (their chooser)
  const Prediction& best() const { return algorithms[picked]; }
};

using cost_model::kPipelinePieceBytes;

using cost_model::WireCodec;
using cost_model::WireCodecSpec;

// A top-k allreduce of `bytes` at `percent` is these two, one after the other: a collective's
// fixed cost and its two allreduces (the chunk energies, 4 bytes per 32 KiB chunk; the chosen
// chunks, at least one), and its passes over the data (node.topk_pass_seconds_per_byte, or
// priced from the local stages' bandwidth where no calibration timed them).
double topk_fixed_seconds(const Layout& layout, const NodeFigures& node, const LinkFigures& link,
                          uint64_t bytes, double percent);
double topk_passes(const Layout& layout, const NodeFigures& node, uint64_t bytes);

using cost_model::AggregatorFigures;

AllreducePrediction predict_allreduce(const Layout& layout, const NodeFigures& node,
                                      const LinkFigures& link, uint64_t bytes,
                                      const WireCodecSpec& codec = {},
                                      const AggregatorFigures& aggregators = {});

// A training step: compute, then the gradients' allreduce, of which `overlap_fraction` of the
// compute time can hide behind the backward pass.
struct TrainingStep {
  double compute_seconds = 0;
  uint64_t gradient_bytes = 0;
  double overlap_fraction = 0;
};

struct ScalingPrediction {
  double communication_seconds = 0;  // the allreduce of all gradients
  double step_seconds = 0;
  double efficiency = 0;  // one GPU's step time over this step time (1: perfect scaling)
  double speedup = 0;     // over one GPU: ranks * efficiency
};

ScalingPrediction predict_scaling(const Layout& layout, const NodeFigures& node,
                                  const LinkFigures& link, const TrainingStep& step,
                                  const WireCodecSpec& codec = {},
                                  const AggregatorFigures& aggregators = {});

}  // namespace gradsync::model
