// The nccl-tests style size sweep: one row per size, time is the median over iterations of the
// slowest rank's time for that iteration.
#include "tools/bench/runner.h"
#include "tools/bench/sweep_buffers.h"
#include "tools/common/reference.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace gradsync::bench {
namespace {

struct Row {
  uint64_t bytes;
  uint64_t count;
  double median_us;
  double mean_us;
  double algbw;
  double busbw;
  uint64_t wrong;
};

// nccl-tests' bus bandwidth factors (PERFORMANCE.md there): what each rank's links carry.
double bus_factor(ipc::Collective kind, int ranks) {
  const double n = ranks;
  switch (kind) {
    case ipc::Collective::kAllreduce:
      return 2 * (n - 1) / n;
    case ipc::Collective::kBroadcast:
      return 1;
    case ipc::Collective::kAllgather:
    case ipc::Collective::kReduceScatter:
    case ipc::Collective::kAllToAll:
      return (n - 1) / n;
    case ipc::Collective::kBarrier:
      break;  // the option parser offers no barrier sweep
  }
  return 1;
}

std::vector<uint64_t> sizes(const BenchOptions& o) {
  std::vector<uint64_t> out;
  for (uint64_t s = o.min_bytes; s <= o.max_bytes;) {
    out.push_back(s);
    const uint64_t next = o.step_bytes > 0 ? s + o.step_bytes : s * o.step_factor;
    if (next <= s) break;
    s = next;
  }
  return out;
}

void write_json(const BenchOptions& o, int ranks, const char* memory,
                const std::vector<Row>& rows) {
  std::ofstream out(o.json_path);
  out << "{\n  \"collective\": \"" << ipc::collective_name(o.collective) << "\",\n  \"memory\": \""
      << memory << "\",\n  \"stream_ordered\": " << (o.stream ? "true" : "false")
      << ",\n  \"in_place\": " << (o.in_place ? "true" : "false")
      << ",\n  \"unnamed\": " << (o.unnamed ? "true" : "false") << ",\n  \"ranks\": " << ranks
      << ",\n  \"dtype\": \"" << dtype_flag_name(o.dtype) << "\",\n  \"op\": \""
      << op_flag_name(o.op) << "\",\n  \"iterations\": " << o.iterations
      << ",\n  \"warmup\": " << o.warmup << ",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << "    {\"bytes\": " << r.bytes << ", \"count\": " << r.count
        << ", \"time_us\": " << r.median_us << ", \"mean_time_us\": " << r.mean_us
        << ", \"algbw_gbps\": " << r.algbw << ", \"busbw_gbps\": " << r.busbw
        << ", \"wrong\": " << r.wrong << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
}

}  // namespace

uint64_t run_sweep(const BenchOptions& o, Communicator& comm, const gradsync_options& who) {
  const int rank = who.rank;
  const int ranks = who.world_size;
  const size_t element = gradsync_dtype_size(o.dtype);
  const bool gather = o.collective == ipc::Collective::kAllgather;
  const bool scatter = o.collective == ipc::Collective::kReduceScatter;
  const bool alltoall = o.collective == ipc::Collective::kAllToAll;
  const bool sends_blocks = ipc::sends_a_block_per_rank(o.collective);
  // A block per rank: the size is the whole of the gathered result, the scattered input or
  // the all-to-all's send (and receive) range.
  const uint64_t blocks = sends_blocks || ipc::receives_a_block_per_rank(o.collective)
                              ? static_cast<uint64_t>(ranks)
                              : 1;
  const uint64_t max_recv = std::max<uint64_t>(o.max_bytes, element * blocks);
  const std::unique_ptr<SweepBuffers> buffers =
      o.device ? make_device_buffers(comm, max_recv, who.local_rank, o.stream)
               : make_host_buffers(comm, max_recv);
  void* const send = buffers->send();
  void* const recv = o.in_place ? send : buffers->recv();
  SharedBuffer scratch = comm.allocate(sizeof(double) * (o.iterations + 1));
  if (rank == 0) {
    std::printf(
        "# gradsync-bench: %s, %d ranks, %s, %s, %s memory%s%s%s, %d iterations (%d warm-up)\n",
        ipc::collective_name(o.collective), ranks, dtype_flag_name(o.dtype), op_flag_name(o.op),
        buffers->memory(), o.stream ? " (stream-ordered)" : "", o.in_place ? ", in place" : "",
        o.unnamed ? ", unnamed" : "", o.iterations, o.warmup);
    std::printf("# time: median over iterations of the slowest rank; busbw as nccl-tests\n");
    std::printf("# %10s %12s %8s %6s %6s %10s %8s %8s %7s\n", "size", "count", "type", "redop",
                "root", "time", "algbw", "busbw", "#wrong");
    std::printf("# %10s %12s %8s %6s %6s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "",
                "(us)", "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }
  std::vector<Row> rows;
  uint64_t wrong_total = 0;
  for (const uint64_t requested : sizes(o)) {
    // Size as in nccl-tests: an allgather's result, a reduce-scatter's input, an all-to-all's
    // send range, ranks * count elements.
    const uint64_t count = requested / element / blocks;
    const uint64_t bytes = count * element * blocks;
    const uint64_t inputs = sends_blocks ? count * blocks : count;
    reference::fill_input(buffers->staged_input(), inputs, o.dtype, rank, o.op, bytes);
    buffers->upload(inputs * element);
    const std::string named = "bench." + std::to_string(bytes);
    const char* name = o.unnamed ? nullptr : named.c_str();
    auto once = [&] {
      switch (o.collective) {
        case ipc::Collective::kAllreduce:
          comm.wait(comm.allreduce(name, send, recv, count, o.dtype, o.op));
          break;
        case ipc::Collective::kBroadcast:
          comm.wait(comm.broadcast(name, send, recv, count, o.dtype, o.root));
          break;
        case ipc::Collective::kAllgather:
          comm.wait(comm.allgather(name, send, recv, count, o.dtype));
          break;
        case ipc::Collective::kReduceScatter:
          comm.wait(comm.reduce_scatter(name, send, recv, count, o.dtype, o.op));
          break;
        case ipc::Collective::kAllToAll:
          comm.wait(comm.alltoall(name, send, recv, count, o.dtype));
          break;
        case ipc::Collective::kBarrier:
          comm.barrier();
          break;
      }
      buffers->finish();
    };
    const std::vector<double> times =
        slowest_rank_times_us(comm, scratch, o.iterations, o.warmup, once);
    uint64_t wrong = 0;
    if (o.check && scatter) {
      wrong = reference::count_wrong_reduce_scatter(buffers->download(recv, count * element), count,
                                                    o.dtype, o.op, ranks, rank, bytes);
    } else if (o.check && alltoall) {
      wrong = reference::count_wrong_alltoall(buffers->download(recv, bytes), count, o.dtype, o.op,
                                              ranks, rank, bytes);
    } else if (o.check) {
      const auto kind =
          gather ? reference::Kind::kAllgather
                 : (o.collective == ipc::Collective::kBroadcast ? reference::Kind::kBroadcast
                                                                : reference::Kind::kAllreduce);
      wrong = reference::count_wrong(kind, buffers->download(recv, bytes), count, o.dtype, o.op,
                                     ranks, o.root, bytes);
    }
    wrong = sum_across_ranks(comm, scratch, wrong);
    wrong_total += wrong;
    Row row{bytes, count, median(times), 0, 0, 0, wrong};
    for (double t : times) row.mean_us += t / static_cast<double>(times.size());
    row.algbw = row.median_us > 0 ? static_cast<double>(bytes) / row.median_us / 1e3 : 0;
    row.busbw = row.algbw * bus_factor(o.collective, ranks);
    rows.push_back(row);
    if (rank == 0) {
      const int root = o.collective == ipc::Collective::kBroadcast ? o.root : -1;
      std::printf("  %10llu %12llu %8s %6s %6d %10.2f %8.2f %8.2f %7llu\n",
                  static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(count),
                  dtype_flag_name(o.dtype), op_flag_name(o.op), root, row.median_us, row.algbw,
                  row.busbw, static_cast<unsigned long long>(wrong));
      std::fflush(stdout);
    }
  }
  if (rank == 0 && !o.json_path.empty()) write_json(o, ranks, buffers->memory(), rows);
  return wrong_total;
}

}  // namespace gradsync::bench
