"""One rank of a job whose collectives have priorities (priority_order.py). Once ready, it
says so (--out + ".ready") and waits for the --go file; then writes to --out, as JSON, the names
of its collectives in the order they completed here. Every result is checked against its
reference.

    --scenario preempt
        --bigs large allreduces at --big-priority, then, --small-after-ms later, --smalls
        small ones at --small-priority, all in flight together; --rounds times, with the same
        names, each round begun by an allreduce named "round", and one more before the go
    --scenario aging
        a stream of --stream allreduces at --high-priority, all in flight, and one at
        --low-priority submitted after the first --before of them"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402


def ready_and_wait(args):
    """Says this rank is ready (--out + ".ready"), then waits for the go file."""
    open(args.out + ".ready", "w").close()
    while not os.path.exists(args.go):
        time.sleep(0.001)


class Collectives:
    """Allreduces in flight, each checked as it completes: rank r contributes r + 1 + v to an
    allreduce of value v, so the sum is size * (size + 1) / 2 + size * v (exact in float32 for
    the values used here)."""

    def __init__(self):
        self.rank, self.size = gradsync.rank(), gradsync.size()
        self.pending = []  # (name, handle, buffer, value)
        self.order = []

    def fill(self, buffer, value):
        buffer.fill_(self.rank + 1 + value)

    def submit(self, name, buffer, value, priority, filled=False):
        if not filled:
            self.fill(buffer, value)
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
        if len(still) == len(self.pending):
            time.sleep(0.001)  # leave the cores to the daemons
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

    def one_round():
        # Filled first: the small ones come while the large ones have only just started.
        for i, buffer in enumerate(bigs):
            collectives.fill(buffer, 3 + i)
        for i, buffer in enumerate(smalls):
            collectives.fill(buffer, 10 + i)
        # A named collective starts each round: the trace's step marker, and a barrier.
        gradsync.allreduce(marker, name="round")
        for i, buffer in enumerate(bigs):
            collectives.submit(f"big.{i}", buffer, 3 + i, args.big_priority, filled=True)
        # The large ones are agreed and running when the small ones come.
        time.sleep(args.small_after_ms / 1000)
        for i, buffer in enumerate(smalls):
            collectives.submit(f"small.{i}", buffer, 10 + i, args.small_priority, filled=True)
        collectives.drain()

    # Once before the go, so that what is recorded runs as every later step would: the
    # daemons have negotiated the names, mapped the buffers and sized their scratch.
    one_round()
    collectives.order.clear()
    ready_and_wait(args)
    for _ in range(args.rounds):
        one_round()


def aging(args, collectives):
    """The whole stream in flight at once, so that the daemon always has higher-priority work
    ready (a rank refilling a window would leave gaps in which the low one runs): --before of
    it first, then the low one, then the rest."""
    count = int(args.mib * (1 << 20)) // 4
    highs = [gradsync.empty(count) for _ in range(args.stream)]
    low = gradsync.empty(count)
    for i, buffer in enumerate(highs):
        collectives.fill(buffer, i % 32)
    collectives.fill(low, 7)
    ready_and_wait(args)
    gradsync.barrier()
    for i, buffer in enumerate(highs):
        if i == args.before:
            collectives.submit("low", low, 7, args.low_priority, filled=True)
        collectives.submit(f"high.{i}", buffer, i % 32, args.high_priority, filled=True)
    collectives.drain()


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
    parser.add_argument("--small-after-ms", type=float, default=0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--stream", type=int, default=120)
    parser.add_argument("--before", type=int, default=8)
    parser.add_argument("--mib", type=float, default=2)
    parser.add_argument("--high-priority", type=int, default=2)
    parser.add_argument("--low-priority", type=int, default=0)
    args = parser.parse_args()

    gradsync.init()
    collectives = Collectives()
    if args.scenario == "preempt":
        preempt(args, collectives)
    else:
        aging(args, collectives)
    with open(args.out, "w") as out:
        json.dump({"rank": collectives.rank, "order": collectives.order}, out)
    gradsync.shutdown()


if __name__ == "__main__":
    main()
