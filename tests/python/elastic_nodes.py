#!/usr/bin/python3
"""A node lost and regained under torchrun's elastic launch, on loopback: two nodes (a daemon and
a torchrun agent each, `--nnodes 1:2`) train examples/train_elastic.py. Node 1 is killed mid-
training (its agent, its workers and its daemon, as a machine that dies): node 0's workers fail
within the bound, torchrun re-forms the job on node 0 alone and it resumes from the last
checkpoint. Then node 1 comes back (a new daemon and agent) and is admitted: the job re-forms on
both nodes. Last, node 1's daemon restarts under its workers (SIGTERM and a new daemon on the
same socket, as `systemctl restart gradsyncd` does): the job re-forms once more and finishes
every step.

    elastic_nodes.py --build-dir build
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from run_ranks import (SKIPPED, free_port, launcher_environment, start_daemon,
                       torch_missing)

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "train_elastic.py")
PACKAGE = os.path.join(HERE, "..", "..", "client", "python")
STEPS = 150
START = re.compile(r"start \d+: rank (\d+) of (\d+), from step (\d+) \(imports (\S+) s, "
                   r"process group (\S+) s, model and checkpoint (\S+) s\)")


class Agent:
    """A torchrun agent (gradsync.run's) and its workers training examples/train_elastic.py, in
    a session of their own; its output, as it comes. `on` wraps the command (to run it on a
    namespace node)."""

    def __init__(self, env, endpoint, rendezvous, checkpoint, nnodes="1:2", per_node=2,
                 steps=STEPS, on=lambda argv: argv):
        command = on([sys.executable, "-m", "gradsync.run", "--nnodes", nnodes,
                      "--nproc_per_node", str(per_node), "--max_restarts", "5",
                      "--rdzv_backend", "gradsync",
                      "--rdzv_endpoint", endpoint, "--rdzv_id", rendezvous,
                      "--rdzv_conf", "last_call_timeout=1,join_timeout=120",
                      "--tee", "1",  # the workers' output, as it comes
                      TRAIN, "--checkpoint", checkpoint, "--steps", str(steps),
                      "--checkpoint-every", "5", "--step-seconds", "0.1"])
        env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE,
                                                                   env.get("PYTHONPATH")])))
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line))
            print(line, end="", flush=True)

    def starts(self):
        """(rank, world size, from step) of every start of this node's workers, in order."""
        return [tuple(map(int, m.groups()[:3])) for _, line in self.lines
                for m in [START.search(line)] if m]

    def restart_after(self, since):
        """How the first restart of this node's workers after `since` went, in seconds: until
        torchrun saw a worker fail (its gradsync call failed; torchrun looks every second), then
        until torchrun had started new workers (its rendezvous included), then how long the new
        workers took for their imports, their process group (the gradsync job) and their model
        and checkpoint."""
        failed = self.first_after(since, "failed (exitcode") - since
        started, line = next((t, line) for t, line in self.lines
                             if t > since and START.search(line))
        imports, group, checkpoint = map(float, START.search(line).groups()[3:])
        spawned = started - since - imports - group - checkpoint
        return {"failed": failed, "restarted": spawned - failed, "imports": imports,
                "process group": group, "checkpoint": checkpoint, "total": started - since}

    def first_after(self, since, text):
        """When the first line after `since` that holds `text` came."""
        return next((t for t, line in self.lines if t > since and text in line), None)

    def kill(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def lose_node(agent, daemon):
    """A node dies as a machine does: its agent, its workers and its daemon SIGKILLed."""
    agent.kill()
    daemon.kill()
    daemon.wait()


def stop_all(agents, daemons):
    """Whatever is still running of `agents` and `daemons` (start_daemon's tuples) stopped."""
    for agent in agents:
        if agent.process.poll() is None:
            agent.kill()
    for daemon, _, _ in daemons:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)


def describe(split):
    """Agent.restart_after's parts as one line."""
    return ", ".join(f"{part} {seconds:.2f} s" for part, seconds in split.items())


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    if torch_missing():
        return SKIPPED
    build_dir = os.path.abspath(args.build_dir)
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = os.path.join(directory, "checkpoint.pt")
        daemons = [start_daemon(build_dir, directory, node) for node in range(2)]
        agents = []
        try:
            base = launcher_environment(build_dir)
            endpoint, rendezvous = f"127.0.0.1:{free_port()}", f"elastic-{os.getpid()}"

            def start_agent(node):
                return Agent(dict(base, GRADSYNC_SOCKET=daemons[node][1]), endpoint, rendezvous,
                             checkpoint)

            agents.append(start_agent(0))  # first: it hosts the rendezvous store
            time.sleep(2)
            agents.append(start_agent(1))
            wait_until(lambda: any(world == 4 for _, world, _ in agents[0].starts()), 120,
                       "the job to form on both nodes")
            wait_until(lambda: os.path.exists(checkpoint), 120, "a first checkpoint")

            lost_at = time.monotonic()
            lose_node(agents[1], daemons[1][0])
            wait_until(lambda: agents[0].starts()[-1][1] == 2, 120,
                       "the job to re-form on node 0 alone")
            lost = agents[0].restart_after(lost_at)
            resumed_from = agents[0].starts()[-1][2]

            # Node 1 comes back: a new daemon at a new address, a new agent.
            daemons[1] = start_daemon(build_dir, directory, 2)
            agents[1] = start_agent(1)
            wait_until(lambda: agents[0].starts()[-1][1] == 4, 120,
                       "node 1 to be admitted again")

            # Node 1's daemon restarts under its workers.
            time.sleep(1)
            starts_before = len(agents[0].starts())
            restarted_at = time.monotonic()
            daemons[1][0].send_signal(signal.SIGTERM)
            if daemons[1][0].wait(timeout=30) != 0:
                raise RuntimeError("node 1's daemon did not stop cleanly")
            daemons[1] = start_daemon(build_dir, directory, 2)  # the same socket as before
            wait_until(lambda: len(agents[0].starts()) > starts_before, 120,
                       "the job to re-form after the daemon's restart")
            after_restart = agents[0].restart_after(restarted_at)
            wait_until(lambda: agents[0].process.poll() is not None, 180, "training to end")
            agents[1].process.wait(timeout=60)
        finally:
            stop_all(agents, daemons)
        codes = [agent.process.returncode for agent in agents]
        done = [line for agent in agents for _, line in agent.lines
                if f"done: {STEPS} steps" in line]
    print(f"agents exited with {codes}; node 0's starts (rank, world, from step): "
          f"{agents[0].starts()}; resumed from step {resumed_from} after node 1 was lost")
    for what, split in (("node 1 lost", lost), ("node 1's daemon restarted", after_restart)):
        print(f"{what}: {describe(split)}")
    if codes != [0, 0] or len(done) != 1 or resumed_from < 5:
        print("training did not finish every step across the loss and the return of node 1")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
