"""One rank of a job sharing its node with others (qos_shares.py): waits for the go file, then
either submits a burst of allreduces at once (--burst) or loops on them until the stop file
appears (--loop). Every result is checked against its reference; the completion times go to
--out as JSON."""
import argparse
import json
import os
import sys
import time

import torch

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
    parser.add_argument("--burst", type=int, default=0)
    args = parser.parse_args()

    gradsync.init()
    rank, size = gradsync.rank(), gradsync.size()
    count = int(args.mib * (1 << 20)) // 4
    # Rank r contributes r + 1 + i to allreduce i: the sum is size * (size + 1) / 2 + size * i.
    expected = lambda i: size * (size + 1) / 2 + size * i  # noqa: E731
    done = []
    if args.burst:  # ready before the go: the burst is submitted at once
        buffers = [gradsync.empty(count) for _ in range(args.burst)]
        for i, buffer in enumerate(buffers):
            buffer.fill_(rank + 1 + i)
    wait_for(args.go)
    started = time.monotonic()
    if args.burst:
        handles = [gradsync.allreduce(b, name=f"burst.{i}", async_op=True)
                   for i, b in enumerate(buffers)]
        submitted = time.monotonic()
        for i, handle in enumerate(handles):
            result = handle.wait()
            done.append(time.monotonic())
            if not torch.all(result == expected(i)):
                raise AssertionError(f"allreduce {i}: wrong result")
    else:
        buffer = gradsync.empty(count)
        stop = gradsync.empty(1)
        i = 0
        while True:
            # Every rank stops after the same allreduce: once any has seen the stop file.
            stop.fill_(1 if os.path.exists(args.stop) else 0)
            gradsync.allreduce(stop, name="stop", op="max")
            if stop[0] > 0:
                break
            value = i % 64  # exact in float32 at any world size here
            buffer.fill_(rank + 1 + value)
            gradsync.allreduce(buffer, name="loop")
            done.append(time.monotonic())
            if buffer[0] != expected(value) or buffer[-1] != expected(value):
                raise AssertionError(f"allreduce {i}: wrong result")
            i += 1
    with open(args.out, "w") as out:
        json.dump({"rank": rank, "done": done, "bytes": count * 4, "started": started,
                   "submitted": submitted if args.burst else started}, out)
    gradsync.shutdown()


if __name__ == "__main__":
    main()
