"""What the peer benchmarks (mpi_allreduce.py, gloo_allreduce.py) share, so that every peer is
measured and reported exactly as gradsync-bench does: sizes in bytes with K/M/G suffixes, the
collective (-c allreduce, broadcast from rank 0, allgather, reduce_scatter or alltoall), per
size the median over
iterations of the slowest rank's time, nccl-tests' algbw and busbw, and the same JSON rows."""
import argparse
import json
import statistics
import sys


def size(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * scale[text[-1]] if text[-1] in scale else int(text)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("-c", choices=["allreduce", "broadcast", "allgather", "reduce_scatter",
                                       "alltoall"], default="allreduce")
    parser.add_argument("-b", type=size, default=8)
    parser.add_argument("-e", type=size, default=64 << 20)
    parser.add_argument("-f", type=int, default=2)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("-w", type=int, default=5)
    parser.add_argument("--json")
    return parser.parse_args()


def counts(args, ranks):
    """Element counts (float32) of the sizes from -b to -e by factor -f, as nccl-tests and
    gradsync-bench count them: an allreduce's or broadcast's buffer, an allgather's result, a
    reduce-scatter's input, an all-to-all's send range (the last three ranks blocks of
    count/ranks elements, rounded down to whole blocks)."""
    nbytes = args.b
    blocks = args.c in ("allgather", "reduce_scatter", "alltoall")
    while nbytes <= args.e:
        count = max(1, nbytes // 4)
        yield max(1, count // ranks) * ranks if blocks else count
        nbytes *= args.f


def print_header(title):
    print(title)
    print(f"# {'size':>10} {'count':>12} {'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}")


def row(count, slowest_us, ranks, wrong, collective="allreduce"):
    """One size's row from the per-iteration times of the slowest rank (µs); `count`: the
    size's elements (counts()). Bus bandwidth as nccl-tests: algbw x 2(n-1)/n for an allreduce,
    x (n-1)/n for an allgather, a reduce-scatter and an all-to-all, algbw for a broadcast."""
    median = statistics.median(slowest_us)
    algbw = count * 4 / median / 1e3
    share = (ranks - 1) / ranks
    factor = {"allreduce": 2 * share, "allgather": share, "reduce_scatter": share,
              "alltoall": share}
    busbw = algbw * factor.get(collective, 1)
    return {"bytes": count * 4, "count": count, "time_us": median, "algbw_gbps": algbw,
            "busbw_gbps": busbw, "wrong": wrong}


def print_row(r):
    print(f"  {r['bytes']:>10} {r['count']:>12} {r['time_us']:>10.2f} {r['algbw_gbps']:>8.2f} "
          f"{r['busbw_gbps']:>8.2f} {r['wrong']:>7}")
    sys.stdout.flush()


def write_json(path, system, ranks, rows):
    with open(path, "w") as out:
        json.dump({"system": system, "ranks": ranks, "rows": rows}, out, indent=2)
