#!/usr/bin/python3
"""Shares between jobs (docs/qos.md), with real daemons and ranks:

    qos_shares.py --build-dir build --one-node
        two jobs of 2 ranks on one daemon, weights 3:1, each keeping 8 allreduces in flight:
        the engine serves the heavy one three bytes for one
    qos_shares.py --build-dir build --namespace-nodes
        two jobs of 1 rank on each of 2 namespace nodes (root) whose links are shaped: the
        rules match by job name, the jobs' shares of the link follow their weights, a reload
        swaps them, and a cap holds

Every allreduce's result is checked by its rank against a reference."""
import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import namespace_nodes
from run_ranks import SKIPPED, daemon_status, expect, start_daemon, torch_missing, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
# The namespace nodes' links.
LINK_RATE = "200mbit"
LINK_BYTES_PER_SECOND = 200e6 / 8


def ctl_jobs(build_dir, socket):
    out = subprocess.run([os.path.join(build_dir, "gradsyncctl"), "--socket", socket, "--json",
                          "jobs"], check=True, capture_output=True, text=True).stdout
    return {job["name"]: job for job in json.loads(out)}


def ctl_table(build_dir, socket):
    return subprocess.run([os.path.join(build_dir, "gradsyncctl"), "--socket", socket, "jobs"],
                          check=True, capture_output=True, text=True).stdout


class Jobs:
    """Rank processes of several jobs; each rank writes its completions to a JSON file."""

    def __init__(self, build_dir, directory):
        self.build_dir, self.directory = build_dir, directory
        self.go = os.path.join(directory, "go")
        self.stop = os.path.join(directory, "stop")
        self.ranks = []  # (job, rank, process, out)

    def start(self, job, sockets, worker_args, nodes=None, daemon_addresses=None):
        """One rank per entry of `sockets` (the daemon each rank talks to)."""
        env = dict(os.environ, GRADSYNC_JOB=job, OMP_NUM_THREADS="1",
                   GRADSYNC_LIBRARY=os.path.join(self.build_dir, "libgradsync.so"),
                   WORLD_SIZE=str(len(sockets)))
        across = daemon_addresses is not None
        if across:
            env.update(GRADSYNC_NODES=",".join(daemon_addresses), LOCAL_WORLD_SIZE="1")
        else:
            env.update(LOCAL_WORLD_SIZE=str(len(sockets)))
        for rank, socket in enumerate(sockets):
            out = os.path.join(self.directory, f"{job}.{rank}.json")
            rank_env = dict(env, RANK=str(rank), GRADSYNC_SOCKET=socket,
                            LOCAL_RANK="0" if across else str(rank))
            if across:
                rank_env["GRADSYNC_NODE_RANK"] = str(rank)
            command = [sys.executable, os.path.join(HERE, "qos_worker.py"), "--go", self.go,
                       "--stop", self.stop, "--out", out] + worker_args
            if nodes is not None:
                command = nodes.on(rank, command)
            self.ranks.append((job, rank, subprocess.Popen(command, env=rank_env), out))

    def finish(self, timeout):
        deadline = time.monotonic() + timeout
        results = {}
        for job, rank, process, out in self.ranks:
            try:
                code = process.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for _, _, p, _ in self.ranks:
                    p.kill()
                raise AssertionError(f"job {job} rank {rank} hung")
            expect(code == 0, f"job {job} rank {rank} exited 0 (its results checked)")
            with open(out) as f:
                results.setdefault(job, []).append(json.load(f))
        return results

    def kill(self):
        for _, _, process, _ in self.ranks:
            if process.poll() is None:
                process.kill()
                process.wait()


def one_node(build_dir, directory):
    config = os.path.join(directory, "gradsyncd.toml")
    with open(config, "w") as f:
        f.write('[[qos.rule]]\njob = "qos-heavy-*"\nweight = 3\n')
    heavy, light = f"qos-heavy-{os.getpid()}", f"qos-light-{os.getpid()}"
    daemon, socket, _ = start_daemon(build_dir, directory, 0, listen="", config=config)
    jobs = Jobs(build_dir, directory)
    try:
        for job in (heavy, light):
            jobs.start(job, [socket, socket], ["--depth", "8", "--mib", "8"])
        wait_until(lambda: len(ctl_jobs(build_dir, socket)) == 2 and all(
            j["local_ranks"] == 2 for j in ctl_jobs(build_dir, socket).values()),
            "both jobs' ranks connected")
        shares = {name: job["qos"] for name, job in ctl_jobs(build_dir, socket).items()}
        expect(shares[heavy]["weight"] == 3 and shares[heavy]["rule"] == 1,
               "the heavy job has its rule's weight 3 (gradsyncctl jobs)")
        expect(shares[light]["weight"] == 1 and shares[light]["rule"] == 0,
               "the light job, which no rule matches, has weight 1")
        open(jobs.go, "w").close()

        # The engine's own count of each job's bytes, over 2 s once both have work: with 8
        # allreduces in flight each, neither runs out of ready work.
        def ran():
            view = ctl_jobs(build_dir, socket)
            return {job: view[job]["qos"]["engine_bytes"] for job in (heavy, light)}
        wait_until(lambda: all(b > 0 for b in ran().values()), "both jobs' allreduces running")
        first = ran()
        time.sleep(2)
        last = ran()
        open(jobs.stop, "w").close()
        jobs.finish(120)
    finally:
        jobs.kill()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    heavy_bytes = last[heavy] - first[heavy]
    light_bytes = last[light] - first[light]
    share = heavy_bytes / max(1, heavy_bytes + light_bytes)
    print(f"over 2 s: heavy {heavy_bytes >> 20} MiB, light {light_bytes >> 20} MiB", flush=True)
    expect(0.68 <= share <= 0.82, f"weights 3:1 give the heavy job {share:.2f} of the engine "
           "(0.75)")
    return 0


def write_rules(path, rules):
    with open(path, "w") as f:
        for rule in rules:
            f.write("[[qos.rule]]\n" + "".join(f"{k} = {v}\n" for k, v in rule.items()))


def namespace_nodes_run(build_dir, directory):
    if not namespace_nodes.available():
        return SKIPPED
    config = os.path.join(directory, "gradsyncd.toml")
    write_rules(config, [{"job": '"bulk-a-*"', "weight": 3}])
    a, b = f"bulk-a-{os.getpid()}", f"bulk-b-{os.getpid()}"
    with contextlib.ExitStack() as stack:
        nodes = stack.enter_context(namespace_nodes.NamespaceNodes(2, rate=LINK_RATE))
        daemons = []
        for node in range(2):
            daemons.append(start_daemon(build_dir, directory, node, nodes=nodes, config=config,
                                        listen=f"{nodes.address(node)}:9478"))
            stack.callback(lambda d=daemons[-1][0]: (d.send_signal(signal.SIGTERM),
                                                     d.wait(timeout=30)))
        sockets = [socket for _, socket, _ in daemons]
        addresses = [listen for _, _, listen in daemons]
        jobs = Jobs(build_dir, directory)
        stack.callback(jobs.kill)
        for job in (a, b):
            jobs.start(job, sockets, ["--mib", "4"], nodes=nodes, daemon_addresses=addresses)
        wait_until(lambda: len(ctl_jobs(build_dir, sockets[0])) == 2 and all(
            j["state"] == "running" for j in ctl_jobs(build_dir, sockets[0]).values()),
            "both jobs formed across the nodes")
        open(jobs.go, "w").close()

        def share_of_a(seconds):
            """Job a's part of node 0's paced bytes, and both jobs' rates, over `seconds`."""
            before = ctl_jobs(build_dir, sockets[0])
            time.sleep(seconds)
            after = ctl_jobs(build_dir, sockets[0])
            sent = {job: after[job]["qos"]["wire_bytes"] - before[job]["qos"]["wire_bytes"]
                    for job in (a, b)}
            total = max(1, sent[a] + sent[b])
            print(f"over {seconds} s: a sent {sent[a] / 1e6:.1f} MB, b {sent[b] / 1e6:.1f} MB",
                  flush=True)
            return sent[a] / total, sent[a] / seconds, sent[b] / seconds

        # The pacer's first figure for the link comes from the jobs' first seconds together,
        # unpaced; it takes longer where the host is busy. Then a fresh window is measured.
        wait_until(lambda: ctl_jobs(build_dir, sockets[0])[a]["qos"]["wire_share"] >= 0.6,
                   "job a's part of the link over a second reaches 0.6", timeout=30)
        share, _, _ = share_of_a(3)
        print(ctl_table(build_dir, sockets[0]), flush=True)
        expect(0.6 <= share <= 0.9, f"weights 3:1 give job a {share:.2f} of the link (0.75)")
        # The pacer's measure of the link, from the jobs that filled it.
        link = daemon_status(build_dir, sockets[0])["link_bytes_per_second"]
        expect(0.7 * LINK_BYTES_PER_SECOND <= link <= 1.3 * LINK_BYTES_PER_SECOND,
               f"the pacer measured the link at {link / 1e6:.1f} MB/s "
               f"({LINK_BYTES_PER_SECOND / 1e6:.0f} MB/s)")

        write_rules(config, [{"job": '"bulk-a-*"', "weight": 1},
                             {"job": '"bulk-b-*"', "weight": 3}])
        for daemon, _, _ in daemons:
            daemon.send_signal(signal.SIGHUP)
        time.sleep(1)
        expect(ctl_jobs(build_dir, sockets[1])[b]["qos"]["weight"] == 3,
               "the reload gave job b its new rule's weight on node 1")
        share, _, _ = share_of_a(3)
        expect(0.1 <= share <= 0.4, f"after the reload, 1:3 give job a {share:.2f} (0.25)")

        # A bad rule is refused at reload, naming its key; the rules before stay.
        write_rules(config, [{"job": '"bulk-a-*"', "weight": -1}])
        for daemon, _, _ in daemons:
            daemon.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        expect(ctl_jobs(build_dir, sockets[0])[b]["qos"]["weight"] == 3,
               "a reload with a negative weight keeps the rules before it")

        cap_gbit = 0.02
        write_rules(config, [{"job": '"bulk-a-*"', "max_gbit_per_s": cap_gbit}])
        for daemon, _, _ in daemons:
            daemon.send_signal(signal.SIGHUP)
        time.sleep(1)
        table = ctl_table(build_dir, sockets[0])
        print(table, flush=True)
        expect("cap 0.02G" in table, "gradsyncctl jobs shows job a's cap")
        seconds = 3
        _, rate_a, rate_b = share_of_a(seconds)
        cap = cap_gbit * 1e9 / 8
        # A send may run into debt by itself: within a window, one message more (half of an
        # allreduce's 4 MiB on 2 nodes) than the cap allows.
        bound = cap + (2 << 20) / seconds
        expect(rate_a <= bound, f"job a's rate {rate_a / 1e6:.2f} MB/s holds its cap "
               f"({cap / 1e6:.2f} MB/s, {bound / 1e6:.2f} with one message more)")
        expect(rate_b >= 3 * rate_a, f"job b takes the rest ({rate_b / 1e6:.2f} MB/s)")
        open(jobs.stop, "w").close()
        jobs.finish(120)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--one-node", action="store_true")
    mode.add_argument("--namespace-nodes", action="store_true")
    args = parser.parse_args()
    if torch_missing():
        return SKIPPED
    build_dir = os.path.abspath(args.build_dir)
    with tempfile.TemporaryDirectory(prefix="gradsync-qos-") as directory:
        if args.one_node:
            return one_node(build_dir, directory)
        return namespace_nodes_run(build_dir, directory)


if __name__ == "__main__":
    sys.exit(main())
