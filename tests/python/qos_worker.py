"""One rank of a job sharing its node with others (qos_shares.py): from the go file until the
stop file, allreduces in a loop, --depth of them in flight. Every result is checked against its
reference; the completion times go to --out as JSON."""
import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.001)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--go", required=True)
    parser.add_argument("--stop")
    parser.add_argument("--out", required=True)
    parser.add_argument("--mib", type=float, default=8)
    parser.add_argument("--depth", type=int, default=1,
                        help="allreduces kept in flight (>1: the job always has work ready)")
    args = parser.parse_args()

    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    count = int(args.mib * (1 << 20)) // 4
    # Rank r contributes r + 1 + v to an allreduce of value v: the sum is
    # size * (size + 1) / 2 + size * v (exact in float32 for the v used here).
    expected = lambda v: size * (size + 1) / 2 + size * v  # noqa: E731
    buffers = [gradsync.empty(count) for _ in range(args.depth)]
    flag = gradsync.empty(1)
    done = []
    in_flight = collections.deque()  # (handle, buffer, value), value None for the stop flag
    stopping = False
    wait_for(args.go)
    i = 0
    while True:
        while len(in_flight) < args.depth and not stopping:
            # Every 8th collective asks whether any rank has seen the stop file: all ranks
            # then stop after the same one.
            if i % 8 == 7:
                flag.fill_(1 if os.path.exists(args.stop) else 0)
                in_flight.append((gradsync.allreduce(flag, name="stop", op="max",
                                                     async_op=True), flag, None))
            else:
                buffer, value = buffers[i % args.depth], i % 64
                buffer.fill_(rank + 1 + value)
                in_flight.append((gradsync.allreduce(buffer, name=f"loop.{i % args.depth}",
                                                     async_op=True), buffer, value))
            i += 1
        if not in_flight:
            break
        handle, buffer, value = in_flight.popleft()
        handle.wait()
        if value is None:
            stopping = stopping or buffer[0] > 0
            continue
        done.append(time.monotonic())
        if buffer[0] != expected(value) or buffer[-1] != expected(value):
            raise AssertionError(f"allreduce {len(done)}: wrong result")
    with open(args.out, "w") as out:
        json.dump({"rank": rank, "done": done, "bytes": count * 4}, out)
    gradsync.shutdown()


if __name__ == "__main__":
    main()
