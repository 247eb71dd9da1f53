#!/usr/bin/python3
"""One rank of a job that shares its links with others (bench/qos): allreduces of one size in a
loop over gradsync, PyTorch's Gloo or Open MPI, from a common start time until its own end
time (wall clock, the same on every namespace node of this machine). Every result is checked;
rank 0 writes each allreduce's end time to --json.

    contention_worker.py --system gradsync --bytes 64M --start T0 --until T1 --json out.json
"""
import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


class Gradsync:
    def __init__(self):
        sys.path.insert(0, os.path.join(ROOT, "client", "python"))
        import gradsync
        self.gradsync = gradsync
        gradsync.init()
        self.rank, self.ranks = gradsync.rank(), gradsync.size()

    def buffer(self, count):
        return self.gradsync.empty(count)

    def fill(self, buffer, value):
        buffer.fill_(value)

    def allreduce(self, buffer, name):
        self.gradsync.allreduce(buffer, name=name)


class Gloo:
    def __init__(self):
        import torch.distributed as dist
        self.dist = dist
        dist.init_process_group("gloo", init_method="env://")
        self.rank, self.ranks = dist.get_rank(), dist.get_world_size()

    def buffer(self, count):
        import torch
        return torch.empty(count, dtype=torch.float32)

    def fill(self, buffer, value):
        buffer.fill_(value)

    def allreduce(self, buffer, name):
        self.dist.all_reduce(buffer)


class Mpi:
    def __init__(self):
        from mpi4py import MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.ranks = self.comm.Get_rank(), self.comm.Get_size()

    def buffer(self, count):
        return np.empty(count, dtype=np.float32)

    def fill(self, buffer, value):
        buffer.fill(value)

    def allreduce(self, buffer, name):
        from mpi4py import MPI
        self.comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["gradsync", "gloo", "mpi"], required=True)
    parser.add_argument("--bytes", type=size, required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--until", type=float, required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    system = {"gradsync": Gradsync, "gloo": Gloo, "mpi": Mpi}[args.system]()
    count = max(1, args.bytes // 4)
    buffer = system.buffer(count)
    expected = system.ranks * (system.ranks + 1) / 2
    # Every rank runs the same number of allreduces: rank 0's clock decides, through a
    # one-element allreduce per iteration (8 B: beside the bulk, as a training loop's own
    # small collectives would be).
    flag = system.buffer(1)
    time.sleep(max(0.0, args.start - time.time()))
    began, done = [], []
    while True:
        flag[0] = 1.0 if system.rank == 0 and time.time() >= args.until else 0.0
        system.allreduce(flag, "stop")
        if flag[0] > 0:
            break
        system.fill(buffer, system.rank + 1)
        began.append(time.time())
        system.allreduce(buffer, "loop")
        done.append(time.time())
        if buffer[0] != expected or buffer[-1] != expected:
            raise SystemExit(f"rank {system.rank}: allreduce {len(done)} gave {buffer[0]}, "
                             f"not {expected}")
    if system.rank == 0:
        with open(args.json, "w") as out:
            json.dump({"system": args.system, "bytes": count * 4, "ranks": system.ranks,
                       "began": began, "done": done}, out)


if __name__ == "__main__":
    main()
