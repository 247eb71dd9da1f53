#!/usr/bin/python3
"""Priorities between a job's collectives (docs/priority.md), with real daemons and ranks:

    priority_order.py --build-dir build --one-node
        a job of 2 ranks on one daemon
    priority_order.py --build-dir build --loopback-nodes
        a job of 1 rank on each of 2 daemons on loopback

In each, large allreduces of priority 0 are in flight when 8 small ones of priority 5 come: the
daemon's trace shows each small one started before any large one was done, and done before
any large one that was not halfway through when they reached the daemon, where with equal
priorities the large ones go first. And a collective of priority 0 under a stream of priority 2 still runs
while the stream goes on, where one of priority -1000 waits for the stream's end. Every
result is checked by its rank against a reference."""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from run_ranks import SKIPPED, expect, start_daemon, torch_missing, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


class Cluster:
    """One daemon, or one per node on loopback, with `config` (TOML)."""

    def __init__(self, build_dir, directory, nodes, config):
        self.build_dir, self.directory = build_dir, directory
        config_file = os.path.join(directory, "gradsyncd.toml")
        with open(config_file, "w") as f:
            f.write(config)
        self.daemons, self.sockets, self.addresses = [], [], []
        try:
            for node in range(nodes):
                daemon, socket, address = start_daemon(
                    build_dir, directory, node, listen="127.0.0.1:0" if nodes > 1 else "",
                    config=config_file)
                self.daemons.append(daemon)
                self.sockets.append(socket)
                self.addresses.append(address)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for daemon in self.daemons:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for daemon in self.daemons:
            daemon.wait(timeout=30)

    def run(self, job, worker_args, ranks_per_node, trace=False):
        """Runs the worker as the job's ranks; returns each rank's completion order and, with
        `trace`, the first daemon's trace of one round (one step)."""
        nodes = len(self.sockets)
        env = dict(os.environ, GRADSYNC_JOB=job, OMP_NUM_THREADS="1",
                   GRADSYNC_LIBRARY=os.path.join(self.build_dir, "libgradsync.so"),
                   WORLD_SIZE=str(nodes * ranks_per_node), LOCAL_WORLD_SIZE=str(ranks_per_node))
        if nodes > 1:
            env["GRADSYNC_NODES"] = ",".join(self.addresses)
        go = os.path.join(self.directory, f"{job}.go")
        processes, outs = [], []
        trace_file = os.path.join(self.directory, f"{job}.trace.json")
        tracer = None
        try:
            for rank in range(nodes * ranks_per_node):
                node = rank // ranks_per_node
                out = os.path.join(self.directory, f"{job}.{rank}.json")
                rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank % ranks_per_node),
                                GRADSYNC_SOCKET=self.sockets[node])
                if nodes > 1:
                    rank_env["GRADSYNC_NODE_RANK"] = str(node)
                processes.append(subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "priority_worker.py"), "--go", go,
                     "--out", out] + worker_args, env=rank_env))
                outs.append(out)
            def ready():
                if any(p.poll() is not None for p in processes):
                    raise AssertionError(f"job {job}: a rank exited before it was ready")
                return all(os.path.exists(out + ".ready") for out in outs)
            wait_until(ready, f"job {job}'s ranks ready")
            if trace:
                tracer = subprocess.Popen(
                    [os.path.join(self.build_dir, "gradsyncctl"), "--socket", self.sockets[0],
                     "trace", "--job", job, "--steps", "1", "--timeout", "60", "-o",
                     trace_file])
                time.sleep(0.5)  # the recording starts before the first round after the go
            open(go, "w").close()
            for rank, process in enumerate(processes):
                code = process.wait(timeout=120)
                expect(code == 0, f"{job}: rank {rank} exited 0 (its results checked)")
            recorded = None
            if tracer is not None:
                expect(tracer.wait(timeout=60) == 0, f"{job}: gradsyncctl trace exited 0")
                with open(trace_file) as f:
                    recorded = json.load(f)
            orders = []
            for out in outs:
                with open(out) as f:
                    orders.append(json.load(f)["order"])
            return orders, recorded
        finally:
            for process in processes + ([tracer] if tracer else []):
                if process.poll() is None:
                    process.kill()
                    process.wait()


def spans(trace):
    """Each tensor's (submitted, start, done) in the trace: the beginning of its negotiation,
    the end of its queue phase (when it started running) and the end of its last event, in
    microseconds."""
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    submitted, started, done = {}, {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        name, end = names[e["tid"]], e["ts"] + e["dur"]
        if e["name"] == "negotiate":
            submitted[name] = min(submitted.get(name, e["ts"]), e["ts"])
        if e["name"] == "queue":
            started[name] = end
        done[name] = max(done.get(name, 0), end)
    return {name: (submitted.get(name, started[name]), started[name], done[name])
            for name in done if name in started}


def check_preemption(cluster, tag, ranks_per_node, bigs, big_mib, small_after_ms):
    common = ["--scenario", "preempt", "--bigs", str(bigs), "--big-mib", str(big_mib),
              "--smalls", "8", "--small-mib", "1", "--rounds", "2",
              "--small-after-ms", str(small_after_ms)]
    # A run in which the small ones reached the daemon only after every large one was halfway
    # through (a rank held up on a busy machine) cannot tell; the next one may.
    for attempt in range(3):
        _, trace = cluster.run(f"priority-{tag}-{attempt}-{os.getpid()}",
                               common + ["--small-priority", "5"], ranks_per_node, trace=True)
        times = spans(trace)
        for name, (submitted, start, done) in sorted(times.items(), key=lambda item: item[1][1]):
            print(f"  {name}: submitted {submitted / 1000:.1f} ms, started {start / 1000:.1f} "
                  f"ms, done {done / 1000:.1f} ms")
        big = [times[f"big.{i}"] for i in range(bigs)]
        small = [times[f"small.{i}"] for i in range(8)]
        came = min(submitted for submitted, _, _ in small)
        # A large one that had handed all its pieces to the network when the small ones came
        # may still be done first (docs/priority.md); one not halfway through then is held back.
        held = [done for _, start, done in big if came < (start + done) / 2]
        if held:
            break
        print(f"{tag}: the small ones came when every large one was halfway through: this run "
              "cannot tell", flush=True)
    expect(len(held) > 0, f"{tag}: in one of 3 runs the small ones came while a large one was "
           "not halfway through")
    first_big_done = min(done for _, _, done in big)
    expect(all(start < first_big_done for _, start, _ in small),
           f"{tag}: at priority 5, each of 8 small allreduces started before any of {bigs} "
           "large ones at priority 0 was done (the daemon's trace)")
    expect(all(done < min(held) for _, _, done in small),
           f"{tag}: each small allreduce was done before any of the {len(held)} large ones not "
           "halfway through when they came")

    _, trace = cluster.run(f"fifo-{tag}-{os.getpid()}", common + ["--small-priority", "0"],
                           ranks_per_node, trace=True)
    times = spans(trace)
    first_big_done = min(times[f"big.{i}"][2] for i in range(bigs))
    expect(all(times[f"small.{i}"][1] >= first_big_done for i in range(8)),
           f"{tag}: with equal priorities, none of the small ones started before a large one "
           "was done (first in, first out)")


def check_aging(cluster, tag, ranks_per_node):
    """A collective of low priority submitted after 8 of a stream of 120 at priority 2, all in
    flight: 2 below them, it ages past the 32 submitted after it (16 a level) and is done
    while the stream goes on; 1002 below them, it waits for the stream's end."""
    args = ["--scenario", "aging", "--stream", "120", "--before", "8", "--mib", "2",
            "--high-priority", "2"]
    positions = {}
    for low in (0, -1000):
        orders, _ = cluster.run(f"aging-{tag}-{low + 1000}-{os.getpid()}",
                                args + ["--low-priority", str(low)], ranks_per_node)
        order = orders[0]
        expect(len(order) == 121 and "low" in order,
               f"{tag}: low priority {low}: all 121 allreduces done, their results checked")
        positions[low] = order.index("low")
    print(f"{tag}: the low-priority allreduce was done as number {positions[0] + 1} of 121 at "
          f"priority 0, {positions[-1000] + 1} at -1000", flush=True)
    expect(positions[0] < 60, f"{tag}: at priority 0 it aged past the stream: done in its "
           "first half")
    expect(positions[-1000] > 100, f"{tag}: at -1000 it waited for (nearly) the whole stream: "
           "the test tells the two apart")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--one-node", action="store_true")
    where.add_argument("--loopback-nodes", action="store_true")
    args = parser.parse_args()
    if torch_missing():
        return SKIPPED
    build_dir = os.path.abspath(args.build_dir)
    nodes, ranks_per_node, tag = (1, 2, "one-node") if args.one_node else (2, 1, "2-nodes")
    with tempfile.TemporaryDirectory(prefix="gradsync-priority-") as directory:
        # Batches of at most 4 of the aging stream's allreduces: its units keep coming.
        cluster = Cluster(build_dir, directory, nodes, f"fusion_threshold_bytes = {8 << 20}\n")
        try:
            if args.one_node:
                # One large one, cut into pieces in shared memory: the small ones come while
                # it runs, right after it.
                check_preemption(cluster, tag, ranks_per_node, bigs=1, big_mib=256,
                                 small_after_ms=0)
            else:
                # Across nodes the large ones are agreed first, in a negotiation of their own.
                check_preemption(cluster, tag, ranks_per_node, bigs=4, big_mib=128,
                                 small_after_ms=20)
            check_aging(cluster, tag, ranks_per_node)
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
