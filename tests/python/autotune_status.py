#!/usr/bin/python3
"""Autotune as an operator sees it (docs/autotune.md), on 2 daemons on loopback with a job of
one rank on each that asks for it (gradsync.init(autotune=True)): once the search has ended,
node 0's `gradsyncctl` says "done" with the settings it chose, node 1's "done on node 0" with
the same settings, `gradsyncctl jobs` shows them, and node 0's metrics export them. Every
step's results are checked by the ranks.

    autotune_status.py --build-dir build"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile

from run_ranks import (SKIPPED, daemon_status, expect, start_daemon, torch_missing,
                       wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_STEPS = 20  # 4 candidates
POOR = ("fusion_threshold_bytes = 65536\npipeline_piece_bytes = 65536\n"
        f"negotiation_hold_us = 0\nautotune_max_steps = {MAX_STEPS}\n")
SETTINGS = ("fusion_threshold_bytes", "piece_bytes", "negotiation_hold_us", "ring_min_bytes")


def job_status(build_dir, socket, job):
    jobs = [j for j in daemon_status(build_dir, socket)["jobs"] if j["name"] == job]
    return jobs[0] if jobs else None


def scrape(address):
    from urllib.request import urlopen
    with urlopen(f"http://{address}/metrics", timeout=10) as response:
        return response.read().decode()


def metric(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    if torch_missing():
        return SKIPPED
    build_dir = os.path.abspath(args.build_dir)
    job = f"autotune-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="gradsync-autotune-") as directory:
        config = os.path.join(directory, "gradsyncd.toml")
        with open(config, "w") as f:
            f.write(POOR)
        daemons, sockets, addresses, ranks = [], [], [], []
        try:
            for node in range(2):
                daemon, socket, address = start_daemon(build_dir, directory, node,
                                                       metrics=node == 0, config=config)
                daemons.append(daemon)
                sockets.append(socket)
                addresses.append(address)
            go = os.path.join(directory, "go")
            outs = [os.path.join(directory, f"rank{r}.done") for r in range(2)]
            for rank in range(2):
                env = dict(os.environ, GRADSYNC_JOB=job, GRADSYNC_SOCKET=sockets[rank],
                           GRADSYNC_NODES=",".join(addresses), GRADSYNC_NODE_RANK=str(rank),
                           RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1",
                           OMP_NUM_THREADS="1",
                           GRADSYNC_LIBRARY=os.path.join(build_dir, "libgradsync.so"))
                env.pop("GRADSYNC_AUTOTUNE", None)
                ranks.append(subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "autotune_worker.py"), "--steps",
                     str(2 * MAX_STEPS), "--out", outs[rank], "--go", go], env=env))

            def done():
                if any(r.poll() not in (None, 0) for r in ranks):
                    raise AssertionError("a rank failed")
                return all(os.path.exists(out) for out in outs)
            wait_until(done, f"{2 * MAX_STEPS} steps on both ranks, every result right",
                       timeout=120)
            node0 = job_status(build_dir, sockets[0], job)["autotune"]
            expect(node0["state"] == "done",
                   f"node 0 searched and is done: {node0['state']}, {node0['trials']} trials")
            chosen = {key: node0[key] for key in SETTINGS}
            print(f"chosen: {chosen}")
            wait_until(lambda: job_status(build_dir, sockets[1], job).get("autotune", {}).get(
                "state") == "done on node 0", "node 1 heard that node 0's search ended",
                timeout=10)
            node1 = job_status(build_dir, sockets[1], job)["autotune"]
            expect({key: node1[key] for key in SETTINGS} == chosen, "node 1 runs node 0's choice")
            table = subprocess.run([os.path.join(build_dir, "gradsyncctl"), "--socket",
                                    sockets[1], "jobs"], capture_output=True, text=True)
            expect(table.returncode == 0 and "autotune done on node 0: fusion" in table.stdout,
                   "gradsyncctl jobs shows the tuned settings:\n" + table.stdout)
            metrics = daemon_status(build_dir, sockets[0])["metrics_listen"]
            label = f'{{training_job="{job}"}}'
            # Sampled once a second.
            wait_until(lambda: metric(scrape(metrics), "gradsync_autotune_done" + label) == 1,
                       "node 0 exports gradsync_autotune_done 1", timeout=10)
            text = scrape(metrics)
            expect(metric(text, "gradsync_autotune_fusion_threshold_bytes" + label) ==
                   chosen["fusion_threshold_bytes"] and
                   metric(text, "gradsync_autotune_piece_bytes" + label) == chosen["piece_bytes"],
                   "and the settings it chose")
            expect(metric(text, "gradsync_autotune_trials" + label) == node0["trials"] >= 2,
                   "and its trials")
            open(go, "w").close()
            for rank, process in enumerate(ranks):
                expect(process.wait(timeout=60) == 0, f"rank {rank} exited 0")
        finally:
            for process in ranks:
                if process.poll() is None:
                    process.kill()
                    process.wait()
            for daemon in daemons:
                if daemon.poll() is None:
                    daemon.send_signal(signal.SIGTERM)
            for daemon in daemons:
                daemon.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
