// gradsync-bench --calibrate FILE: the measurements gradsync-model fits its figures to
// (tools/model/calibration.h). Every rank of the job takes part; rank 0 writes the file.
//  1. Rank 0 alone: memcpy and a two-input reduction over buffers larger than any cache, on
//     every core at once.
//  2. Node 0's ranks alone, as a job of their own on the same daemon: an allreduce of 8 bytes
//     and one of the large size (-e, default 32 MiB).
//  3. Every rank, as a job with the ring forced: the same two allreduces across the nodes;
//     then, as a job with halving-doubling forced, the large one again.
// The other ranks wait at a barrier while one part runs, so that nothing else competes for
// the cores it measures.
#include "kernels/reduce.h"
#include "tools/bench/runner.h"
#include "tools/common/reference.h"
#include "tools/model/calibration.h"

#include <fmt/format.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gradsync::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMemoryBytes = 256ull << 20;  // well past the last-level cache
constexpr int kMemoryRounds = 5;
constexpr int kSmallIterations = 1000;
constexpr int kSmallWarmup = 100;
constexpr int kLargeIterations = 10;
constexpr int kLargeWarmup = 2;

template <typename Body>
double median_seconds(int rounds, Body body) {
  std::vector<double> times;
  for (int round = 0; round < rounds; ++round) {
    const auto start = Clock::now();
    body();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(times);
}

// Runs body(begin, end) over [0, count) split among every core of the machine, at once.
template <typename Body>
void on_every_core(size_t count, Body body) {
  const size_t cores = std::max(1U, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  threads.reserve(cores);
  for (size_t core = 0; core < cores; ++core) {
    threads.emplace_back(body, count * core / cores, count * (core + 1) / cores);
  }
  for (auto& thread : threads) thread.join();
}

// Bytes per second of a copy and of a two-input f32 sum (per output byte), on every core at
// once: what the machine's memory can do, which bounds what the daemon's reduce pool can.
void measure_memory(model::CalibrationRun& run) {
  std::vector<float> a(kMemoryBytes / sizeof(float), 1.0F);
  std::vector<float> b(a.size(), 2.0F);
  std::vector<float> c(a.size(), 0.0F);
  // With the stores the daemon uses for large results: they skip the read for ownership.
  run.copy_bytes_per_second =
      kMemoryBytes / median_seconds(kMemoryRounds, [&] {
        on_every_core(a.size(), [&](size_t begin, size_t end) {
          kernels::copy(&c[begin], &a[begin], (end - begin) * sizeof(float), true);
        });
      });
  run.reduce_bytes_per_second = kMemoryBytes / median_seconds(kMemoryRounds, [&] {
                                  on_every_core(a.size(), [&](size_t begin, size_t end) {
                                    const void* inputs[] = {&a[begin], &b[begin]};
                                    void* outputs[] = {&c[begin]};
                                    kernels::reduce_to_all(GRADSYNC_FLOAT32, GRADSYNC_SUM, inputs,
                                                           2, outputs, 1, end - begin, true);
                                  });
                                });
}

// The median over iterations of the slowest rank's time for an allreduce of `bytes`, by `rank`.
double time_allreduce(Communicator& comm, int rank, uint64_t bytes, int iterations, int warmup) {
  // Out of place and on the sweep's inputs, as the sweeps gradsync-model is compared with: on
  // zeros the daemon's reduce ran 15-20% faster here (32 MiB, one node), and top-k, which
  // sends the chunks of most energy, would choose among equals.
  SharedBuffer send = comm.allocate(bytes);
  SharedBuffer recv = comm.allocate(bytes);
  SharedBuffer scratch = comm.allocate(sizeof(double) * static_cast<size_t>(iterations));
  const size_t count = bytes / sizeof(float);
  reference::fill_input(send.data(), count, GRADSYNC_FLOAT32, rank, GRADSYNC_SUM, bytes);
  const std::string name = "calibrate." + std::to_string(bytes);
  auto once = [&] {
    comm.wait(comm.allreduce(name.c_str(), send.data(), recv.data(), count, GRADSYNC_FLOAT32,
                             GRADSYNC_SUM));
  };
  return median(slowest_rank_times_us(comm, scratch, iterations, warmup, once)) / 1e6;
}

// A calibration job's settings: the wire codec as given, never the environment's (a sweep run
// with GRADSYNC_WIRE_CODEC set calibrates the exact path all the same).
gradsync_job_settings with_codec(const char* codec) {
  gradsync_job_settings settings{};
  settings.struct_bytes = sizeof(settings);
  std::snprintf(settings.wire_codec, sizeof(settings.wire_codec), "%s", codec);
  return settings;
}

// On a busy machine a moment of contention can make the small allreduce's median the larger
// of the two, which no fit can use: the pair is measured again, a few times at most. Every
// rank holds the same (slowest-rank) times, so every rank decides alike.
model::TimedPair time_pair(const gradsync_options& options, uint64_t large_bytes) {
  constexpr int kAttempts = 3;
  Communicator comm(options, with_codec("none"));
  model::TimedPair pair;
  for (int attempt = 0; attempt < kAttempts && pair.large_seconds <= pair.small_seconds;
       ++attempt) {
    pair = {time_allreduce(comm, options.rank, model::kCalibrationSmallBytes, kSmallIterations,
                           kSmallWarmup),
            time_allreduce(comm, options.rank, large_bytes, kLargeIterations, kLargeWarmup)};
  }
  return pair;
}

double time_large(const gradsync_options& options, uint64_t large_bytes,
                  const char* codec = "none") {
  Communicator comm(options, with_codec(codec));
  return time_allreduce(comm, options.rank, large_bytes, kLargeIterations, kLargeWarmup);
}

// A job beside the caller's, named after it.
gradsync_options sibling_job(const gradsync_options& who, const char* suffix) {
  gradsync_options options = who;
  const std::string job = std::string(who.job) + suffix;
  if (job.size() >= sizeof(options.job)) throw std::invalid_argument("job name too long: " + job);
  std::snprintf(options.job, sizeof(options.job), "%s", job.c_str());
  return options;
}

// The caller's job again, as a job of its own that runs every allreduce by `algorithm`.
gradsync_options forcing(const gradsync_options& who, const char* algorithm) {
  gradsync_options options = sibling_job(who, (std::string(".calibrate-") + algorithm).c_str());
  std::snprintf(options.algorithm, sizeof(options.algorithm), "%s", algorithm);
  return options;
}

// The largest cache of CPU 0, from sysfs (sysconf's figure is wrong on some virtual machines);
// 0 when unknown.
uint64_t last_level_cache_bytes() {
  uint64_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) +
                       "/size");
    uint64_t kib = 0;
    if (file >> kib) largest = std::max(largest, kib << 10);
  }
  return largest;
}

}  // namespace

void run_calibration(const BenchOptions& o, Communicator& comm, const gradsync_options& who) {
  if (who.local_world_size <= 0 || who.world_size % who.local_world_size != 0) {
    throw std::invalid_argument("--calibrate needs the same number of ranks on every node");
  }
  model::CalibrationRun run;
  run.layout = {static_cast<uint32_t>(who.world_size / who.local_world_size),
                static_cast<uint32_t>(who.local_world_size)};
  run.large_bytes = o.max_bytes / sizeof(float) * sizeof(float);
  // Ranks are numbered node by node: node 0 holds ranks 0 .. K-1.
  const bool on_node_0 = who.rank < who.local_world_size;

  if (who.rank == 0) {
    measure_memory(run);
    run.last_level_cache_bytes = last_level_cache_bytes();
  }
  comm.barrier();
  if (on_node_0) {
    gradsync_options local = sibling_job(who, ".calibrate-local");
    local.rank = who.local_rank;
    local.world_size = who.local_world_size;
    local.nodes[0] = '\0';
    local.node_rank = -1;
    run.local = time_pair(local, run.large_bytes);
  }
  comm.barrier();
  if (run.layout.nodes > 1) {
    run.cluster = time_pair(forcing(who, "ring"), run.large_bytes);
    run.cluster_halving_doubling_large_seconds = time_large(forcing(who, "rhd"), run.large_bytes);
    const std::string topk = fmt::format("topk:{}", model::kCalibrationTopKPercent);
    run.cluster_topk_large_seconds =
        time_large(sibling_job(who, ".calibrate-topk"), run.large_bytes, topk.c_str());
  }
  if (who.rank != 0) return;

  std::ofstream(o.calibrate_path) << model::to_json(run).dump(2) << "\n";
  const model::Figures figures = model::fit_figures(run);
  std::printf("# gradsync-bench --calibrate: %u nodes x %u ranks, written to %s\n",
              run.layout.nodes, run.layout.ranks_per_node, o.calibrate_path.c_str());
  std::printf("  memory: copy %.2f GB/s, reduce %.2f GB/s\n", run.copy_bytes_per_second / 1e9,
              run.reduce_bytes_per_second / 1e9);
  std::printf("  per collective %.1f us, local stages %.2f GB/s",
              figures.node.overhead_seconds * 1e6, figures.node.local_bytes_per_second / 1e9);
  if (run.cluster) {
    std::printf(", links %.1f us per step, %.3f GB/s", figures.link.alpha_seconds * 1e6,
                1 / figures.link.beta_seconds_per_byte / 1e9);
  }
  std::printf("\n");
  if (run.cluster) {
    std::printf(
        "  across the nodes, %llu bytes: ring %.2f ms, halving-doubling %.2f ms, top-k at %g%% "
        "%.2f ms\n",
        static_cast<unsigned long long>(run.large_bytes), run.cluster->large_seconds * 1e3,
        run.cluster_halving_doubling_large_seconds.value_or(0) * 1e3,
        model::kCalibrationTopKPercent, run.cluster_topk_large_seconds.value_or(0) * 1e3);
  }
}

}  // namespace gradsync::bench
