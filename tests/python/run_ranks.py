#!/usr/bin/python3
"""Runs a Python worker as K local ranks of one job against a private gradsyncd.

    run_ranks.py --build-dir build --ranks 2 --worker ddp_worker.py [worker options]
    run_ranks.py --build-dir build --ranks 3 --worker ddp_worker.py --raise-at 3
        (rank 1 fails mid-training: it must die, every other rank must get gradsync's error)
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def start_daemon(build_dir, directory):
    socket = os.path.join(directory, "gradsyncd.sock")
    daemon = subprocess.Popen([os.path.join(build_dir, "gradsyncd"), "--socket", socket,
                               "--metrics-listen", "", "--listen", "127.0.0.1:0",
                               "--log-level", "warn"])
    deadline = time.monotonic() + 20
    while not os.path.exists(socket):
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("gradsyncd did not start")
        time.sleep(0.01)
    return daemon, socket


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--worker", default="ddp_worker.py")
    args, worker_args = parser.parse_known_args()
    raising = "--raise-at" in worker_args

    with tempfile.TemporaryDirectory() as directory:
        daemon, socket = start_daemon(os.path.abspath(args.build_dir), directory)
        try:
            env = dict(os.environ, GRADSYNC_SOCKET=socket, GRADSYNC_JOB=f"ddp-{os.getpid()}",
                       GRADSYNC_LIBRARY=os.path.join(os.path.abspath(args.build_dir),
                                                     "libgradsync.so"),
                       WORLD_SIZE=str(args.ranks), LOCAL_WORLD_SIZE=str(args.ranks))
            init_file = os.path.join(directory, "gloo-init")
            workers = []
            for rank in range(args.ranks):
                workers.append(subprocess.Popen(
                    ["/usr/bin/python3", os.path.join(HERE, args.worker),
                     "--init-file", init_file] + worker_args,
                    env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank))))
            deadline = time.monotonic() + args.timeout
            codes = []
            for rank, worker in enumerate(workers):
                try:
                    codes.append(worker.wait(timeout=max(1, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    print(f"rank {rank} hung", flush=True)
                    for w in workers:
                        w.kill()
                    return 1
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon_code = daemon.wait(timeout=30)
    print(f"worker exit codes {codes}, gradsyncd {daemon_code}")
    if daemon_code != 0:
        return 1
    if raising:
        # The failing rank dies with its exception; every other rank gets gradsync's error.
        failing = 1
        others_ok = all(code == 3 for rank, code in enumerate(codes) if rank != failing)
        return 0 if codes[failing] not in (0, 3) and others_ok else 1
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
