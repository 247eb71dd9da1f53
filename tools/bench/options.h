// gradsync-bench's command line, nccl-tests style.
#pragma once

#include "ipc/protocol.h"
#include "tools/common/sizes.h"

#include <gradsync/gradsync.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gradsync::bench {

struct BenchOptions {
  int processes = 0;  // -np: spawn this many local ranks; 0: run as one rank from the env
  bool spawn_daemon = false;
  int cluster_nodes = 0;      // --cluster N: N namespace nodes, -np ranks each
  std::string cluster_rate;   // --rate: shape each node's link (tc tbf), e.g. 1gbit
  std::string daemon_path;    // default: gradsyncd beside this executable
  std::string daemon_config;  // --daemon-config: the spawned daemons' TOML configuration
  ipc::Collective collective = ipc::Collective::kAllreduce;
  uint64_t min_bytes = 32ull << 20;
  uint64_t max_bytes = 32ull << 20;
  uint64_t step_factor = 2;
  uint64_t step_bytes = 0;  // -i: additive step instead of a factor
  gradsync_dtype dtype = GRADSYNC_FLOAT32;
  gradsync_op op = GRADSYNC_SUM;
  int root = 0;
  int iterations = 20;
  int warmup = 5;
  bool check = false;
  bool device = false;  // --device: the sweep's buffers on the rank's GPU
  // --stream (with --device): collectives ordered on a CUDA stream, as the PyTorch hook orders
  // them; each iteration's time runs to the end of the stream's work.
  bool stream = false;
  // --in-place: a broadcast's one buffer is the root's input and every rank's result, as in
  // MPI_Bcast and torch.distributed.broadcast (out of place, the root copies its input too).
  bool in_place = false;
  // --unnamed: the sweep's collectives submitted without names, as the torch.distributed
  // backend and C programs that pass NULL submit theirs (the client names each afresh).
  bool unnamed = false;
  std::string json_path;
  std::string model;        // "resnet50": the gradient set of a training step instead of a sweep
  bool fused = false;       // model mode: one tensor of the model's total size
  bool names_only = false;  // model mode: the model's names, one element each
  int steps = 50;
  std::string calibrate_path;  // --calibrate: measure gradsync-model's figures into this file
  bool progress = true;
  std::vector<std::string> rank_argv;  // argv for spawned ranks (without -np / --spawn-daemon)
};

// Parses argv; throws std::invalid_argument with a message naming the flag.
BenchOptions parse_options(int argc, char** argv);
std::string usage();

using tools::parse_size;                            // tools/common/sizes.h
const char* dtype_flag_name(gradsync_dtype dtype);  // nccl-tests names
const char* op_flag_name(gradsync_op op);

}  // namespace gradsync::bench
