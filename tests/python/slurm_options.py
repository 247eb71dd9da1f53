#!/usr/bin/python3
"""A task's options as srun starts it (no torchrun, no GRADSYNC_NODES): gradsync_options_from_env
takes its place and its job's nodes from Slurm's variables, each node resolved, at the port
GRADSYNC_NODE_PORT names; what torchrun or gradsync set explicitly wins; a malformed variable is
an error naming it.

    slurm_options.py LIBRARY
"""
import ctypes
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
from gradsync import _library  # noqa: E402

SRUN = {"SLURM_PROCID": "3", "SLURM_NTASKS": "6", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "127.0.0.[2-3],localhost", "SLURM_TASKS_PER_NODE": "3,1(x2)",
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "1", "GRADSYNC_NODE_PORT": "9555"}
OURS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GRADSYNC_JOB", "GRADSYNC_NODES",
        "GRADSYNC_NODE_RANK", "TORCHELASTIC_RUN_ID"]


def options_from(lib, environment):
    for name in OURS + list(SRUN):
        os.environ.pop(name, None)
    os.environ.update(environment)
    options = _library.Options()
    code = lib.gradsync_options_from_env(ctypes.byref(options))
    return code, options, lib.gradsync_last_error(None).decode()


def main():
    os.environ["GRADSYNC_LIBRARY"] = sys.argv[1]
    lib = _library.load()
    failures = []

    def expect(ok, what):
        if not ok:
            failures.append(what)

    code, o, error = options_from(lib, SRUN)
    expect(code == 0, f"options from srun's variables: {error}")
    expect((o.rank, o.world_size, o.local_rank, o.local_world_size) == (3, 6, 0, 1),
           f"the task's place: {o.rank} {o.world_size} {o.local_rank} {o.local_world_size}")
    expect(o.job.decode() == "slurm.4242.1", f"the job's name: {o.job}")
    expect(o.nodes.decode() == "127.0.0.2:9555,127.0.0.3:9555,127.0.0.1:9555",
           f"the nodes: {o.nodes}")
    expect(o.node_rank == 1, f"the node: {o.node_rank}")

    code, o, error = options_from(lib, dict(SRUN, RANK="5", WORLD_SIZE="8", GRADSYNC_JOB="mine",
                                            GRADSYNC_NODES="198.18.0.1:1,198.18.0.2:1",
                                            GRADSYNC_NODE_RANK="0"))
    expect(code == 0 and (o.rank, o.world_size) == (5, 8) and o.job.decode() == "mine" and
           o.nodes.decode() == "198.18.0.1:1,198.18.0.2:1" and o.node_rank == 0,
           f"explicit variables win: {code} {error} {o.rank} {o.world_size} {o.job} {o.nodes}")

    code, o, error = options_from(lib, dict(SRUN, SLURM_JOB_NODELIST="gpu5"))
    expect(code == 0 and o.nodes.decode() == "" and o.local_world_size == 1,
           f"one node: no node list: {code} {error} {o.nodes}")

    code, o, error = options_from(lib, dict(SRUN, SLURM_JOB_NODELIST="node[1-"))
    expect(code != 0 and "brackets" in error, f"a malformed host list: {code} {error}")
    code, o, error = options_from(lib, dict(SRUN, SLURM_JOB_NODELIST="no-such-host.invalid,x"))
    expect(code != 0 and "no-such-host.invalid" in error, f"a host that does not resolve: {error}")
    code, o, error = options_from(lib, dict(SRUN, GRADSYNC_NODE_PORT="70000"))
    expect(code != 0 and "GRADSYNC_NODE_PORT" in error, f"a port out of range: {error}")

    for failure in failures:
        print("FAILED:", failure)
    print("slurm options:", "failed" if failures else "right")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
