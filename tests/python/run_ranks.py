#!/usr/bin/python3
"""Runs a Python worker as K local ranks of one job against a private gradsyncd.

    run_ranks.py --build-dir build --ranks 2 --worker ddp_worker.py [worker options]
    run_ranks.py --build-dir build --ranks 3 --worker ddp_worker.py --raise-at 3
        (rank 1 fails mid-training: it must die, every other rank must get gradsync's error)
    run_ranks.py --build-dir build --nodes 2 --ranks 4 ...
        (a loopback cluster: one gradsyncd per node, ranks split evenly across them)
    run_ranks.py --build-dir build --nodes 2 --ranks 4 --store-rendezvous ...
        (the same, the nodes' daemons found through torch.distributed's store)
    run_ranks.py --build-dir build --nodes 2 --ranks 4 --slurm ...
        (the same as srun starts tasks: nodes in network namespaces, each daemon at its node's
        address and one port, each rank's place in Slurm's variables alone; needs root)
"""
import argparse
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import namespace_nodes
from namespace_nodes import NODE_UCX

HERE = os.path.dirname(os.path.abspath(__file__))
SKIPPED = 77  # a worker that cannot run here (ctest's skip code for these tests)
SLURM_PORT = 9478  # every node's daemon's, as a site's configuration sets it


def expect(condition, what):
    """Raises unless `condition`; says what held otherwise."""
    if not condition:
        raise AssertionError(what)
    print(f"ok: {what}", flush=True)


def wait_until(condition, what, timeout=60):
    """Polls `condition` every 50 ms; raises naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


def start_daemon(build_dir, directory, node, metrics=False, listen="127.0.0.1:0", nodes=None,
                 config=None):
    """A daemon listening at `listen` (by default on a port it picks itself); its socket and
    inter-node address. With `metrics`, it serves them on a port of its own too (gradsyncctl
    status names it). With `nodes` (namespace_nodes.NamespaceNodes), it runs on that node;
    with `config`, it reads that configuration file."""
    socket = os.path.join(directory, f"gradsyncd{node}.sock")
    if os.path.exists(socket):  # left by a daemon that was killed: wait for the new one's
        os.unlink(socket)
    command = [os.path.join(build_dir, "gradsyncd"), "--socket", socket,
               "--metrics-listen", "127.0.0.1:0" if metrics else "", "--listen", listen,
               "--log-level", "warn"] + (["--config", config] if config else [])
    env = None
    if nodes is not None:
        command, env = nodes.on(node, command), dict(os.environ, **NODE_UCX)
    daemon = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(socket):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("gradsyncd did not start")
            time.sleep(0.01)
        return daemon, socket, daemon_status(build_dir, socket)["listen"]
    except BaseException:
        daemon.kill()  # the caller never learns of it: it must not outlive the test
        daemon.wait()
        raise


def daemon_status(build_dir, socket):
    """What `gradsyncctl status` says of the daemon at `socket`: its addresses among others."""
    status = subprocess.run([os.path.join(build_dir, "gradsyncctl"), "--socket", socket,
                             "--json", "status"], check=True, capture_output=True, text=True)
    return json.loads(status.stdout)


def torch_missing():
    """True, having said so, where this Python has no PyTorch (the caller then skips)."""
    if importlib.util.find_spec("torch") is not None:
        return False
    print("skipped: no PyTorch")
    return True


def launcher_environment(build_dir, **extra):
    """The environment for ranks a launcher (torchrun) starts, with `extra` set: the build's
    library, one thread each, and nothing of a job's layout, which the launcher gives."""
    env = dict(os.environ, GRADSYNC_LIBRARY=os.path.join(build_dir, "libgradsync.so"),
               OMP_NUM_THREADS="1", **extra)
    for name in ("GRADSYNC_NODES", "GRADSYNC_NODE_RANK", "GRADSYNC_JOB"):
        env.pop(name, None)
    return env


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def slurm_environment(rank, ranks, hosts, port):
    """What srun gives task `rank` of `ranks` spread evenly over the nodes `hosts` (and
    GRADSYNC_NODE_PORT, the daemons' port, which a site's configuration sets)."""
    per_node = ranks // len(hosts)
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(ranks),
            "SLURM_LOCALID": str(rank % per_node), "SLURM_NODEID": str(rank // per_node),
            "SLURM_JOB_NODELIST": ",".join(hosts),
            "SLURM_TASKS_PER_NODE": f"{per_node}(x{len(hosts)})",
            "SLURM_JOB_ID": str(os.getpid()), "SLURM_STEP_ID": "0",
            "GRADSYNC_NODE_PORT": str(port)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--worker", default="ddp_worker.py")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--torch-env", action="store_true",
                        help="the workers find each other as under torchrun (MASTER_ADDR and "
                        "MASTER_PORT), not through --init-file")
    parser.add_argument("--store-rendezvous", action="store_true",
                        help="no GRADSYNC_NODES or node ranks: the backend learns the nodes' "
                        "daemons through torch.distributed's store")
    parser.add_argument("--slurm", action="store_true",
                        help="start the ranks as srun does: their places in Slurm's variables")
    parser.add_argument("--rank-fails", action="store_true",
                        help="rank 1 fails on purpose (as with the DDP worker's --raise-at)")
    args, worker_args = parser.parse_known_args()
    raising = args.rank_fails or "--raise-at" in worker_args

    if args.ranks % args.nodes != 0:
        parser.error("--ranks must be a multiple of --nodes")
    per_node = args.ranks // args.nodes
    if args.slurm and not namespace_nodes.available():
        return SKIPPED
    with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as stack:
        build_dir = os.path.abspath(args.build_dir)
        nodes, hosts = None, []
        if args.slurm:
            nodes = stack.enter_context(namespace_nodes.NamespaceNodes(args.nodes))
            hosts = [nodes.address(node) for node in range(args.nodes)]
        daemons = [start_daemon(build_dir, directory, node, nodes=nodes,
                                listen=f"{hosts[node]}:{SLURM_PORT}" if nodes else "127.0.0.1:0")
                   for node in range(args.nodes)]
        listens = [listen for _, _, listen in daemons]
        try:
            env = dict(os.environ, GRADSYNC_JOB=f"ddp-{os.getpid()}",
                       GRADSYNC_LIBRARY=os.path.join(build_dir, "libgradsync.so"),
                       WORLD_SIZE=str(args.ranks), LOCAL_WORLD_SIZE=str(per_node))
            if args.nodes > 1 and not args.store_rendezvous:
                env["GRADSYNC_NODES"] = ",".join(listens)
            rendezvous = ["--init-file", os.path.join(directory, "gloo-init")]
            if args.torch_env:
                rendezvous = []
                env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            workers = []
            for rank in range(args.ranks):
                node = rank // per_node
                rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank % per_node),
                                GRADSYNC_SOCKET=daemons[node][1])
                if not args.store_rendezvous:
                    rank_env["GRADSYNC_NODE_RANK"] = str(node)
                command = [sys.executable, os.path.join(HERE, args.worker)] + rendezvous
                if args.slurm:
                    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                 "GRADSYNC_JOB", "GRADSYNC_NODES", "GRADSYNC_NODE_RANK"):
                        rank_env.pop(name, None)
                    rank_env.update(slurm_environment(rank, args.ranks, hosts, SLURM_PORT),
                                    GLOO_SOCKET_IFNAME="eth0")  # the reference's, on the veth
                    command = nodes.on(node, command)
                workers.append(subprocess.Popen(command + worker_args, env=rank_env))
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
            daemon_code = 0
            for daemon, _, _ in daemons:
                daemon.send_signal(signal.SIGTERM)
                daemon_code = max(daemon_code, daemon.wait(timeout=30))
    print(f"worker exit codes {codes}, gradsyncd {daemon_code}")
    if daemon_code != 0:
        return 1
    if raising:
        # The failing rank dies with its exception; every other rank gets gradsync's error.
        failing = 1
        others_ok = all(code == 3 for rank, code in enumerate(codes) if rank != failing)
        return 0 if codes[failing] not in (0, 3) and others_ok else 1
    if all(code == SKIPPED for code in codes):
        print("skipped: every worker said it cannot run here (no CUDA device for PyTorch)")
        return SKIPPED
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
