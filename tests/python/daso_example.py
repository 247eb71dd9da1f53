#!/usr/bin/python3
"""examples/train_daso.py across two loopback nodes (a daemon and a torchrun agent each), with
--sync ddp and with --sync daso: both learn the task, DASO to within a few points of DDP's
held-out accuracy (a short run: 8 epochs, one of warm-up and one of cool-down), sending fewer
bytes across nodes than DDP. By how much depends on how soon the losses plateau, which brings
the global averages closer together, and in a run this short on the links' measurements of
DASO's two groups as they form (about 8 MB each; BENCHMARKS.md has longer runs).

    daso_example.py --build-dir build
"""
import argparse
import os
import re
import signal
import sys
import tempfile

from run_ranks import (SKIPPED, daemon_status, free_port, launcher_environment, start_daemon,
                       torch_missing)
from torchrun_nodes import torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "train_daso.py")
RESULT = re.compile(r"(ddp|daso): accuracy (\S+), (\S+) s, (\d+) bytes a step")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--timeout", type=float, default=400)
    args = parser.parse_args()
    if torch_missing():
        return SKIPPED
    build_dir = os.path.abspath(args.build_dir)
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        daemons = [start_daemon(build_dir, directory, node, metrics=True) for node in range(2)]
        try:
            base = launcher_environment(build_dir)
            for sync in ("ddp", "daso"):
                port = free_port()
                outputs = torchrun(
                    [["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                      "--rdzv_id", f"{sync}-{os.getpid()}"] for _ in range(2)],
                    [dict(base, GRADSYNC_SOCKET=socket) for _, socket, _ in daemons],
                    [[TRAIN, "--sync", sync, "--epochs", "8", "--steps-per-epoch", "16",
                      "--warmup-epochs", "1", "--cooldown-epochs", "1",
                      "--metrics", daemon_status(build_dir, socket)["metrics_listen"]]
                     for _, socket, _ in daemons],
                    args.timeout)
                found = [m.groups() for output in outputs for m in [RESULT.search(output)] if m]
                if len(found) != 1:
                    print(f"{sync}: expected one result line, found {len(found)}")
                    return 1
                results[sync] = (float(found[0][1]), float(found[0][2]), int(found[0][3]))
        finally:
            for daemon, _, _ in daemons:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=30)
    (ddp_accuracy, ddp_seconds, ddp_bytes), (daso_accuracy, daso_seconds, daso_bytes) = (
        results["ddp"], results["daso"])
    print(f"ddp: accuracy {ddp_accuracy}, {ddp_seconds} s, {ddp_bytes} bytes a step; "
          f"daso: accuracy {daso_accuracy}, {daso_seconds} s, {daso_bytes} bytes a step")
    # Chance is 0.1. Of 8 epochs, 6 cycle, with a global average every 8th step at first.
    ok = (ddp_accuracy >= 0.3 and daso_accuracy >= ddp_accuracy - 0.1 and daso_bytes > 0
          and daso_bytes * 4 <= ddp_bytes * 3)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
