"""A rank of tests/python/autotune_status.py: gradsync.init(autotune=True), --steps steps of a
set of allreduces of several sizes, each result checked; then it says it is done (--out) and
waits for the go file (--go) before it leaves, so that the test can look at the job while it
lives."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync  # noqa: E402

COUNTS = (16, 1000, 30000, 250000, 64, 120000, 7, 500000)  # floats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--go", required=True)
    args = parser.parse_args()
    gradsync.init(autotune=True)
    rank, size = gradsync.rank(), gradsync.size()
    buffers = [gradsync.empty(count) for count in COUNTS]
    for step in range(args.steps):
        handles = []
        for i, buffer in enumerate(buffers):
            buffer.fill_(rank + 1 + step + i)
            handles.append(gradsync.allreduce(buffer, name=f"grad.{i}", async_op=True))
        for i, (buffer, handle) in enumerate(zip(buffers, handles)):
            handle.wait()
            expected = size * (size + 1) / 2 + size * (step + i)
            if buffer[0] != expected or buffer[-1] != expected:
                raise AssertionError(f"step {step}, grad.{i}: {float(buffer[0])}, not {expected}")
    open(args.out, "w").close()
    while not os.path.exists(args.go):
        time.sleep(0.01)
    gradsync.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
