#!/usr/bin/python3
"""examples/train_elastic.py under torchrun's elastic launch, over a private gradsyncd: a worker
fails at step 25 of 30, torchrun restarts both, they re-form as a new gradsync job and resume
from the step-20 checkpoint, and the parameters end equal to those of a run without the failure.

    elastic_restart.py --build-dir build
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile

from run_ranks import SKIPPED, launcher_environment, start_daemon, torch_missing

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "train_elastic.py")
DIGEST = re.compile(r"parameter digest (\S+)")


def train(env, checkpoint, crash_at, timeout):
    """One torchrun run of two workers; its output. Raises if it fails."""
    # --redirects and --tee: torchrun 1.13 on Python 3.11 cannot parse its own defaults.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "--max_restarts", "1", "--redirects", "2", "--tee", "1",
               TRAIN, "--checkpoint", checkpoint, "--steps", "30", "--crash-at", str(crash_at)]
    run = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=timeout, check=False)
    print(run.stdout, flush=True)
    if run.returncode != 0:
        raise RuntimeError(f"torchrun exited with {run.returncode}")
    return run.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if torch_missing():
        return SKIPPED
    build_dir = os.path.abspath(args.build_dir)
    with tempfile.TemporaryDirectory() as directory:
        daemon, socket, _ = start_daemon(build_dir, directory, 0)
        try:
            env = launcher_environment(build_dir, GRADSYNC_SOCKET=socket)
            restarted = train(env, os.path.join(directory, "restarted.pt"), 25, args.timeout)
            straight = train(env, os.path.join(directory, "straight.pt"), 0, args.timeout)
        finally:
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(timeout=30)
    if code != 0:
        print(f"gradsyncd exited with {code}")
        return 1
    if "start 1: rank 0 of 2, from step 20" not in restarted:
        print("the restarted workers did not resume from the step-20 checkpoint")
        return 1
    digests = [DIGEST.findall(output) for output in (restarted, straight)]
    print(f"digests: restarted {digests[0]}, straight {digests[1]}")
    if len(digests[0]) != 1 or digests[0] != digests[1]:
        print("the runs differ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
