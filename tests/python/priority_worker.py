"""One rank of a job whose collectives have priorities (priority_order.py). Writes to --out, as
JSON, the names of its collectives in the order they completed here; every result is checked
against its reference.

    --scenario preempt
        --bigs large allreduces at --big-priority, then --smalls small ones at
        --small-priority, all in flight together; --rounds times, with the same names, each
        round begun by an allreduce named "round"
    --scenario aging
        a stream of --stream allreduces at --high-priority, --depth of them in flight, and one
        at priority 0 submitted once the stream has started"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.001)


class Collectives:
    """Allreduces in flight, each checked as it completes: rank r contributes r + 1 + v to an
    allreduce of value v, so the sum is size * (size + 1) / 2 + size * v (exact in float32 for
    the values used here)."""

    def __init__(self):
        self.rank, self.size = gradsync.rank(), gradsync.size()
        self.pending = []  # (name, handle, buffer, value)
        self.order = []

    def submit(self, name, buffer, value, priority):
        buffer.fill_(self.rank + 1 + value)
        handle = gradsync.allreduce(buffer, name=name, async_op=True, priority=priority)
        self.pending.append((name, handle, buffer, value))

    def poll(self):
        """Records every collective found complete by one look at each."""
        still = []
        for entry in self.pending:
            name, handle, buffer, value = entry
            if not handle.test():
                still.append(entry)
                continue
            expected = self.size * (self.size + 1) / 2 + self.size * value
            if buffer[0] != expected or buffer[-1] != expected:
                raise AssertionError(f"{name}: {float(buffer[0])}, where {expected} is due")
            self.order.append(name)
        self.pending = still

    def drain(self):
        while self.pending:
            self.poll()


def preempt(args, collectives):
    big_count = int(args.big_mib * (1 << 20)) // 4
    small_count = int(args.small_mib * (1 << 20)) // 4
    bigs = [gradsync.empty(big_count) for _ in range(args.bigs)]
    smalls = [gradsync.empty(small_count) for _ in range(args.smalls)]
    marker = gradsync.empty(1)
    for _ in range(args.rounds):
        # A named collective starts each round: the trace's step marker, and a barrier.
        gradsync.allreduce(marker, name="round")
        for i, buffer in enumerate(bigs):
            collectives.submit(f"big.{i}", buffer, 3 + i, args.big_priority)
        for i, buffer in enumerate(smalls):
            collectives.submit(f"small.{i}", buffer, 10 + i, args.small_priority)
        collectives.drain()


def aging(args, collectives):
    count = int(args.mib * (1 << 20)) // 4
    buffers = [gradsync.empty(count) for _ in range(args.depth)]
    low = gradsync.empty(count)
    gradsync.barrier()
    submitted = 0
    uses = [0] * args.depth  # of each slot: its n-th allreduce has the same value on every rank
    while submitted < args.stream or collectives.pending:
        busy = {name for name, _, _, _ in collectives.pending}
        for slot in range(args.depth):
            if submitted < args.stream and f"high.{slot}" not in busy:
                collectives.submit(f"high.{slot}", buffers[slot], uses[slot] % 32,
                                   args.high_priority)
                uses[slot] += 1
                submitted += 1
                if submitted == args.depth:
                    collectives.submit("low", low, 7, 0)
        collectives.poll()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--go", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", choices=["preempt", "aging"], required=True)
    parser.add_argument("--bigs", type=int, default=1)
    parser.add_argument("--big-mib", type=float, default=64)
    parser.add_argument("--big-priority", type=int, default=0)
    parser.add_argument("--smalls", type=int, default=8)
    parser.add_argument("--small-mib", type=float, default=1)
    parser.add_argument("--small-priority", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--stream", type=int, default=200)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--mib", type=float, default=8)
    parser.add_argument("--high-priority", type=int, default=5)
    args = parser.parse_args()

    gradsync.init()
    collectives = Collectives()
    wait_for(args.go)
    if args.scenario == "preempt":
        preempt(args, collectives)
    else:
        aging(args, collectives)
    with open(args.out, "w") as out:
        json.dump({"rank": collectives.rank, "order": collectives.order}, out)
    gradsync.shutdown()


if __name__ == "__main__":
    main()
