#include "tools/bench/options.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

namespace gradsync::bench {
namespace {

// The nccl-tests name of each dtype comes first; the others are accepted too.
const std::vector<std::pair<std::string, gradsync_dtype>> kDtypes = {
    {"float", GRADSYNC_FLOAT32},     {"double", GRADSYNC_FLOAT64},  {"half", GRADSYNC_FLOAT16},
    {"bfloat16", GRADSYNC_BFLOAT16}, {"int32", GRADSYNC_INT32},     {"int64", GRADSYNC_INT64},
    {"float32", GRADSYNC_FLOAT32},   {"float64", GRADSYNC_FLOAT64}, {"float16", GRADSYNC_FLOAT16},
    {"int", GRADSYNC_INT32}};
const std::map<std::string, gradsync_op> kOps = {
    {"sum", GRADSYNC_SUM}, {"prod", GRADSYNC_PROD}, {"min", GRADSYNC_MIN}, {"max", GRADSYNC_MAX},
    {"avg", GRADSYNC_AVG}, {"band", GRADSYNC_BAND}, {"bor", GRADSYNC_BOR}, {"bxor", GRADSYNC_BXOR}};

int parse_int(const std::string& flag, const std::string& text, int min) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < min || value > 1'000'000'000) {
    throw std::invalid_argument(flag + ": expected an integer >= " + std::to_string(min) +
                                ", got '" + text + "'");
  }
  return static_cast<int>(value);
}

}  // namespace

const char* dtype_flag_name(gradsync_dtype dtype) {
  for (const auto& [name, value] : kDtypes) {
    if (value == dtype) return name.c_str();
  }
  return "?";
}

const char* op_flag_name(gradsync_op op) {
  for (const auto& [name, value] : kOps) {
    if (value == op) return name.c_str();
  }
  return "?";
}

std::string usage() {
  return "usage: gradsync-bench [-np K] [--spawn-daemon | --cluster N [--rate 1gbit]]\n"
         "  [-c allreduce|broadcast|allgather|reduce_scatter|alltoall]\n"
         "  -b MIN -e MAX [-f FACTOR | -i STEP]   sizes in bytes, K/M/G suffixes\n"
         "  -d float|double|half|bfloat16|int32|int64   -r ROOT\n"
         "  -o sum|prod|min|max|avg|band|bor|bxor   (band, bor, bxor: int32 and int64 only)\n"
         "  -n ITERS -w WARMUP  --check  --json FILE  --daemon PATH  --help  --version\n"
         "  --device   the sweep's buffers on the rank's GPU (LOCAL_RANK mod devices)\n"
         "  --stream   with --device: ordered on a CUDA stream, timed to the stream's end\n"
         "  --in-place   broadcast: one buffer, the root's input and every rank's result\n"
         "  --unnamed   the sweep's collectives without names (as torch.distributed's)\n"
         "  --model resnet50 [--fused | --names-only] [--steps N] [--no-progress]\n"
         "  --calibrate FILE   measure gradsync-model's figures (large size: -e)\n"
         "  --daemon-config FILE   configuration of the daemons --spawn-daemon or --cluster start\n"
         "--cluster N: N nodes in network namespaces (root), -np ranks each.\n"
         "Without -np, runs as one rank whose identity comes from RANK, WORLD_SIZE,\n"
         "LOCAL_RANK, LOCAL_WORLD_SIZE; it talks to the daemon at GRADSYNC_SOCKET.\n";
}

BenchOptions parse_options(int argc, char** argv) {
  BenchOptions o;
  o.rank_argv.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    auto keep = [&](const std::string& v) {
      o.rank_argv.push_back(flag);
      o.rank_argv.push_back(v);
    };
    if (flag == "-np") {
      o.processes = parse_int(flag, value(), 1);
    } else if (flag == "--spawn-daemon") {
      o.spawn_daemon = true;
    } else if (flag == "--cluster") {
      o.cluster_nodes = parse_int(flag, value(), 1);
    } else if (flag == "--rate") {
      o.cluster_rate = value();
    } else if (flag == "--daemon") {
      o.daemon_path = value();
    } else if (flag == "--daemon-config") {
      o.daemon_config = value();
    } else if (flag == "-c" || flag == "--collective") {
      const std::string v = value();
      if (v == "allreduce")
        o.collective = ipc::Collective::kAllreduce;
      else if (v == "broadcast")
        o.collective = ipc::Collective::kBroadcast;
      else if (v == "allgather")
        o.collective = ipc::Collective::kAllgather;
      else if (v == "reduce_scatter")
        o.collective = ipc::Collective::kReduceScatter;
      else if (v == "alltoall")
        o.collective = ipc::Collective::kAllToAll;
      else
        throw std::invalid_argument(flag + ": unknown collective '" + v + "'");
      keep(v);
    } else if (flag == "-b" || flag == "--minbytes") {
      const std::string v = value();
      o.min_bytes = parse_size(v);
      keep(v);
    } else if (flag == "-e" || flag == "--maxbytes") {
      const std::string v = value();
      o.max_bytes = parse_size(v);
      keep(v);
    } else if (flag == "-f" || flag == "--stepfactor") {
      const std::string v = value();
      o.step_factor = static_cast<uint64_t>(parse_int(flag, v, 2));
      keep(v);
    } else if (flag == "-i" || flag == "--stepbytes") {
      const std::string v = value();
      o.step_bytes = parse_size(v);
      keep(v);
    } else if (flag == "-d" || flag == "--datatype") {
      const std::string v = value();
      const auto it = std::find_if(kDtypes.begin(), kDtypes.end(),
                                   [&v](const auto& entry) { return entry.first == v; });
      if (it == kDtypes.end()) throw std::invalid_argument(flag + ": unknown dtype '" + v + "'");
      o.dtype = it->second;
      keep(v);
    } else if (flag == "-o" || flag == "--op") {
      const std::string v = value();
      const auto it = kOps.find(v);
      if (it == kOps.end()) throw std::invalid_argument(flag + ": unknown op '" + v + "'");
      o.op = it->second;
      keep(v);
    } else if (flag == "-r" || flag == "--root") {
      const std::string v = value();
      o.root = parse_int(flag, v, 0);
      keep(v);
    } else if (flag == "-n" || flag == "--iters") {
      const std::string v = value();
      o.iterations = parse_int(flag, v, 1);
      keep(v);
    } else if (flag == "-w" || flag == "--warmup_iters") {
      const std::string v = value();
      o.warmup = parse_int(flag, v, 0);
      keep(v);
    } else if (flag == "--device") {
      o.device = true;
      o.rank_argv.push_back(flag);
    } else if (flag == "--stream") {
      o.stream = true;
      o.rank_argv.push_back(flag);
    } else if (flag == "--in-place") {
      o.in_place = true;
      o.rank_argv.push_back(flag);
    } else if (flag == "--unnamed") {
      o.unnamed = true;
      o.rank_argv.push_back(flag);
    } else if (flag == "--check" || flag == "-z") {
      o.check = true;
      o.rank_argv.push_back("--check");
    } else if (flag == "--json") {
      const std::string v = value();
      o.json_path = v;
      keep(v);
    } else if (flag == "--model") {
      const std::string v = value();
      if (v != "resnet50") throw std::invalid_argument(flag + ": unknown model '" + v + "'");
      o.model = v;
      keep(v);
    } else if (flag == "--calibrate") {
      const std::string v = value();
      o.calibrate_path = v;
      keep(v);
    } else if (flag == "--fused") {
      o.fused = true;
      o.rank_argv.push_back(flag);
    } else if (flag == "--names-only") {
      o.names_only = true;
      o.rank_argv.push_back(flag);
    } else if (flag == "--steps") {
      const std::string v = value();
      o.steps = parse_int(flag, v, 1);
      keep(v);
    } else if (flag == "--no-progress") {
      o.progress = false;
      o.rank_argv.push_back(flag);
    } else {
      throw std::invalid_argument("unknown flag '" + flag + "'");
    }
  }
  if (o.min_bytes > o.max_bytes) throw std::invalid_argument("-b is larger than -e");
  if (!ipc::op_reduces(o.op, o.dtype)) {
    throw std::invalid_argument(std::string("-o ") + op_flag_name(o.op) +
                                " reduces integers only: -d int32 or int64");
  }
  if (!o.calibrate_path.empty() && !o.model.empty())
    throw std::invalid_argument("--calibrate and --model exclude each other");
  if (o.device && (!o.model.empty() || !o.calibrate_path.empty()))
    throw std::invalid_argument("--device is for the size sweep, not --model or --calibrate");
  if (o.stream && !o.device) throw std::invalid_argument("--stream orders --device collectives");
  if (o.unnamed && (!o.model.empty() || !o.calibrate_path.empty()))
    throw std::invalid_argument("--unnamed is for the size sweep, not --model or --calibrate");
  if (o.in_place && (o.collective != ipc::Collective::kBroadcast || !o.model.empty() ||
                     !o.calibrate_path.empty())) {
    throw std::invalid_argument(
        "--in-place is for the broadcast sweep (an allreduce in place would sum its own result "
        "each iteration)");
  }
  if (o.fused && o.names_only)
    throw std::invalid_argument("--fused and --names-only exclude each other");
  if (o.cluster_nodes > 0 && o.spawn_daemon) {
    throw std::invalid_argument("--cluster starts its own daemons: drop --spawn-daemon");
  }
  if (!o.cluster_rate.empty() && o.cluster_nodes == 0) {
    throw std::invalid_argument("--rate shapes the links of a --cluster");
  }
  return o;
}

}  // namespace gradsync::bench
