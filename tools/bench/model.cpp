// A training step's gradient traffic: every parameter tensor of the model allreduced by name,
// submitted in backprop order (last layer first), all in flight at once, as a DDP or Horovod
// hook would. --fused sends one tensor of the same total size instead, for comparison;
// --names-only keeps the names and gives every tensor one element: the step then measures the
// control plane (negotiation, completion) with next to no data.
#include "tools/bench/resnet50.h"
#include "tools/bench/runner.h"
#include "tools/common/reference.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>

namespace gradsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

void draw_progress(int done, int total, double last_ms) {
  constexpr int kWidth = 40;
  const int filled = done * kWidth / total;
  std::fprintf(stderr, "\r  [%.*s%*s] %3d/%d steps  %7.2f ms/step", filled,
               "########################################", kWidth - filled, "", done, total,
               last_ms);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// The step's figures for bench/compare: bytes per rank, the median and spread of the slowest
// rank's step time.
void write_json(const BenchOptions& o, size_t tensors, size_t bytes, int ranks,
                const std::vector<double>& times, uint64_t wrong) {
  const double med = median(times);
  const double algbw = static_cast<double>(bytes) / (med * 1e-3) / 1e9;
  const nlohmann::json out = {
      {"mode", "model"},
      {"model", o.model},
      {"tensors", tensors},
      {"bytes", bytes},
      {"fused", o.fused},
      {"names_only", o.names_only},
      {"ranks", ranks},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"step_ms", med},
      {"step_ms_p10", percentile(times, 0.1)},
      {"step_ms_p90", percentile(times, 0.9)},
      {"algbw_gbps", algbw},
      {"busbw_gbps", algbw * 2.0 * (ranks - 1) / ranks},
      {"wrong", wrong},
  };
  std::ofstream(o.json_path) << out.dump(2) << "\n";
}

}  // namespace

uint64_t run_model(const BenchOptions& o, Communicator& comm, int rank, int ranks) {
  std::vector<ParameterTensor> tensors = resnet50_parameters();
  size_t total = 0;
  for (const auto& t : tensors) total += t.elements;
  if (o.fused) tensors = {{"resnet50.fused", total}};
  if (o.names_only) {
    for (auto& t : tensors) t.elements = 1;
    total = tensors.size();
  }
  const size_t element = gradsync_dtype_size(o.dtype);
  SharedBuffer grads = comm.allocate(total * element);
  SharedBuffer reduced = comm.allocate(total * element);
  SharedBuffer scratch = comm.allocate(sizeof(double) * (o.steps + 1));
  reference::fill_input(grads.data(), total, o.dtype, rank, o.op);
  std::vector<size_t> offsets;
  size_t offset = 0;
  for (const auto& t : tensors) {
    offsets.push_back(offset);
    offset += t.elements;
  }
  if (rank == 0) {
    std::printf("# %s gradients: %zu tensors, %zu %s parameters (%.1f MB), %d ranks, %d steps%s\n",
                o.model.c_str(), tensors.size(), total, dtype_flag_name(o.dtype),
                static_cast<double>(total * element) / 1e6, ranks, o.steps,
                o.fused ? ", fused into one tensor" : "");
    std::fflush(stdout);
  }
  std::vector<gradsync_request> requests(tensors.size());
  auto step = [&] {
    for (size_t i = tensors.size(); i-- > 0;) {
      const auto* send = grads.as<uint8_t>() + offsets[i] * element;
      auto* recv = reduced.as<uint8_t>() + offsets[i] * element;
      requests[i] =
          comm.allreduce(tensors[i].name.c_str(), send, recv, tensors[i].elements, o.dtype, o.op);
    }
    for (size_t i = tensors.size(); i-- > 0;) comm.wait(requests[i]);
  };
  for (int i = 0; i < o.warmup; ++i) step();
  comm.barrier();
  std::vector<double> times(static_cast<size_t>(o.steps));
  for (int s = 0; s < o.steps; ++s) {
    const auto start = Clock::now();
    step();
    times[static_cast<size_t>(s)] =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (rank == 0 && o.progress) draw_progress(s + 1, o.steps, times[static_cast<size_t>(s)]);
  }
  uint64_t wrong = 0;
  if (o.check) {
    wrong = reference::count_wrong(reference::Kind::kAllreduce, reduced.data(), total, o.dtype,
                                   o.op, ranks, 0);
  }
  max_across_ranks(comm, scratch, times);
  wrong = sum_across_ranks(comm, scratch, wrong);
  if (rank == 0) {
    const double bytes = static_cast<double>(total * element);
    const double med = median(times);
    const double algbw = bytes / (med * 1e-3) / 1e9;
    const double busbw = algbw * 2.0 * (ranks - 1) / ranks;
    std::printf("\n  %-22s %10s %10s %10s\n", "", "median", "p10", "p90");
    std::printf("  %-22s %10.2f %10.2f %10.2f\n", "step time (ms)", med, percentile(times, 0.1),
                percentile(times, 0.9));
    std::printf("  %-22s %10.2f %10.2f %10.2f\n", "algbw (GB/s)", algbw,
                bytes / (percentile(times, 0.9) * 1e-3) / 1e9,
                bytes / (percentile(times, 0.1) * 1e-3) / 1e9);
    std::printf("  %-22s %10.2f\n", "busbw (GB/s)", busbw);
    std::printf("  %-22s %10llu\n", "#wrong", static_cast<unsigned long long>(wrong));
    std::fflush(stdout);
    if (!o.json_path.empty()) write_json(o, tensors.size(), total * element, ranks, times, wrong);
  }
  return wrong;
}

}  // namespace gradsync::bench
