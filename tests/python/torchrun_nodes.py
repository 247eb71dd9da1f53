#!/usr/bin/python3
"""Two nodes' daemons on loopback, DDP training launched by torchrun as a user would across two
machines: one torchrun agent per node, each with only its daemon's socket set.

    torchrun_nodes.py --build-dir build [--steps N]

Run 1 gives the node list by hand (GRADSYNC_NODES, GRADSYNC_NODE_RANK, torchrun's static
rendezvous with --node_rank). Run 2 gives nothing but the socket: torchrun's c10d rendezvous
orders the agents, and the backend learns the nodes' daemons through its store. Both must
train, and print the same losses: the same ranks sum the same gradients in the same order.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from run_ranks import (SKIPPED, free_port, launcher_environment, start_daemon,
                       torch_missing)

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "train_ddp.py")
RANKS_PER_NODE = 2
LOSS = re.compile(r"step\s+(\d+)\s+loss\s+([0-9.]+)")


def torchrun(node_args, env, scripts, timeout):
    """One torchrun agent per node, together, each running its script (a path and its
    arguments) on RANKS_PER_NODE workers; each agent's output. Raises if one fails."""
    agents = []
    for args, node_env, script in zip(node_args, env, scripts):
        # --redirects and --tee: torchrun 1.13 on Python 3.11 cannot parse its own defaults.
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc_per_node", str(RANKS_PER_NODE), "--redirects", "2", "--tee", "1",
                   *args, *script]
        agents.append(subprocess.Popen(command, env=node_env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
    outputs = []
    deadline = time.monotonic() + timeout
    try:
        for agent in agents:
            output, _ = agent.communicate(timeout=max(1, deadline - time.monotonic()))
            print(output, flush=True)
            outputs.append(output)
    except subprocess.TimeoutExpired:
        raise RuntimeError("a torchrun agent hung") from None
    finally:
        for agent in agents:  # the others too, where one failed or hung
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    codes = [agent.returncode for agent in agents]
    if any(codes):
        raise RuntimeError(f"torchrun agents exited with {codes}")
    return outputs


def losses(outputs):
    """Rank 0's (step, loss) lines, from whichever agent ran it."""
    found = [LOSS.findall(output) for output in outputs]
    found = [lines for lines in found if lines]
    if len(found) != 1:
        raise RuntimeError(f"expected one agent to print losses, {len(found)} did")
    return found[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if torch_missing():
        return SKIPPED
    build_dir = os.path.abspath(args.build_dir)
    with tempfile.TemporaryDirectory() as directory:
        daemons = [start_daemon(build_dir, directory, node) for node in range(2)]
        try:
            base = launcher_environment(build_dir, GRADSYNC_ALGO="ring")
            listens = ",".join(listen for _, _, listen in daemons)
            script = [TRAIN, "--steps", str(args.steps), "--batch-size", "16"]

            # The node list by hand, torchrun's static rendezvous.
            port = free_port()
            listed = torchrun(
                [["--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port",
                  str(port)] for node in range(2)],
                [dict(base, GRADSYNC_SOCKET=socket, GRADSYNC_NODES=listens,
                      GRADSYNC_NODE_RANK=str(node), GRADSYNC_JOB=f"listed-{os.getpid()}")
                 for node, (_, socket, _) in enumerate(daemons)],
                [script] * 2, args.timeout)

            # Nothing but each node's socket, torchrun's c10d rendezvous.
            port = free_port()
            found = torchrun(
                [["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                  "--rdzv_id", f"found-{os.getpid()}"] for _ in range(2)],
                [dict(base, GRADSYNC_SOCKET=socket) for _, socket, _ in daemons],
                [script] * 2, args.timeout)
        finally:
            codes = []
            for daemon, _, _ in daemons:
                daemon.send_signal(signal.SIGTERM)
                codes.append(daemon.wait(timeout=30))
    if any(codes):
        print(f"gradsyncd exit codes {codes}")
        return 1
    listed_losses, found_losses = losses(listed), losses(found)
    print(f"listed: {listed_losses}\nfound through the store: {found_losses}")
    if not listed_losses or listed_losses != found_losses:
        print("the runs differ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
