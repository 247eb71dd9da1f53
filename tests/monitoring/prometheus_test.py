#!/usr/bin/env python3
"""A real Prometheus server scrapes three gradsyncd on loopback while they run real collectives.

Node 0 runs a one-node job of known size, then both nodes run two-node jobs that stay busy, one
of them through the third daemon, an aggregator (docs/aggregators.md). The test
asks Prometheus's HTTP API whether the counters moved by exactly what the one-node job did,
evaluates every query of the Grafana dashboard (each must parse and return data), and runs
`promtool check metrics` on a live scrape.

usage: prometheus_test.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

BUILD, SOURCE = sys.argv[1], sys.argv[2]
STEPS, TENSORS, MAX_COUNT = 3, 24, 100


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bound_ports(socket_path):
    """The ports a daemon started on port 0 bound: (metrics, inter-node)."""
    status = json.loads(subprocess.run(
        [f"{BUILD}/gradsyncctl", "--socket", socket_path, "--json", "status"],
        check=True, capture_output=True, text=True).stdout)
    return tuple(int(status[key].rsplit(":", 1)[1]) for key in ("metrics_listen", "listen"))


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def wait_until(what, predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"FAIL: {what} within {timeout} s")


def rank(socket_path, job, rank_, world, local, local_world, args, nodes=None, node_rank=None,
         extra_env=None):
    env = dict(os.environ, GRADSYNC_SOCKET=socket_path, GRADSYNC_JOB=job, RANK=str(rank_),
               WORLD_SIZE=str(world), LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(local_world),
               **(extra_env or {}))
    if nodes:
        env.update(GRADSYNC_NODES=nodes, GRADSYNC_NODE_RANK=str(node_rank))
    return subprocess.Popen([f"{BUILD}/gradsync-test-rank", *args], env=env,
                            stdout=subprocess.DEVNULL)


def main():
    processes = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            sockets = [f"{tmp}/node0.sock", f"{tmp}/node1.sock", f"{tmp}/aggregator.sock"]
            for n, socket_path in enumerate(sockets):
                role = ["--role", "aggregator"] if n == 2 else []
                processes.append(subprocess.Popen(
                    [f"{BUILD}/gradsyncd", "--socket", socket_path, "--log-level", "warn",
                     "--metrics-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", *role]))
            wait_until("the daemons listen", lambda: all(os.path.exists(s) for s in sockets))
            # Each picked its ports itself: none can be taken by another test before it binds.
            metrics, listen = zip(*(bound_ports(s) for s in sockets))

            config = f"{tmp}/prometheus.yml"
            with open(config, "w") as f:
                f.write("global:\n  scrape_interval: 1s\nscrape_configs:\n"
                        "  - job_name: gradsync\n    static_configs:\n"
                        "      - targets: [" +
                        ", ".join(f"'127.0.0.1:{port}'" for port in metrics) + "]\n")
            api = f"127.0.0.1:{free_port()}"
            processes.append(subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
                 f"--web.listen-address={api}", "--log.level=warn"]))

            def query(expr):
                url = f"http://{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
                try:
                    answer = json.loads(get(url))
                except urllib.error.HTTPError as e:  # a query that does not parse: 400
                    body = e.read().decode()
                    try:
                        answer = json.loads(body)
                    except ValueError:
                        # Not an answer of the API: Prometheus still starting ("Service
                        # Unavailable", 503). An OSError, which wait_until waits through.
                        raise ConnectionError(f"Prometheus not ready: {e.code} {body!r}") from e
                if answer.get("status") != "success":
                    raise SystemExit(f"FAIL: {expr}: {answer.get('error')}")
                return answer["data"]["result"]

            def value(expr):
                result = query(expr)
                return float(result[0]["value"][1]) if result else None

            wait_until("Prometheus scrapes the three daemons",
                       lambda: value('sum(up{job="gradsync"})') == 3)
            node0 = f'instance="127.0.0.1:{metrics[0]}"'
            local = f'gradsync_collectives_completed_total{{{node0},op="allreduce",algorithm="local"}}'
            payload = f'gradsync_collective_bytes_total{{{node0},op="allreduce"}}'
            assert value(local) == 0 and value(payload) == 0, "counters must start at zero"

            # A one-node job of known size: STEPS steps of TENSORS allreduces on 2 ranks.
            one_node = [rank(sockets[0], "known", r, 2, r, 2,
                             ["steps", str(STEPS), str(TENSORS), str(MAX_COUNT)]) for r in range(2)]
            for p in one_node:
                assert p.wait(timeout=120) == 0, "a rank of the one-node job failed"
            expected_bytes = STEPS * 4 * sum(1 + (i * 7919) % MAX_COUNT for i in range(TENSORS))
            wait_until(f"Prometheus sees {STEPS * TENSORS} local allreduces",
                       lambda: value(local) == STEPS * TENSORS)
            assert value(payload) == expected_bytes, (value(payload), expected_bytes)
            durations = f'sum(gradsync_collective_duration_seconds_count{{{node0},op="allreduce"}})'
            assert value(durations) == STEPS * TENSORS, value(durations)
            # Each rank's submissions found their buffer mapped: one lookup each, as they run
            # in place (send and receive in one buffer).
            # (Counted by each session and reported once a second or when it goes.)
            hits = f'gradsync_mapping_cache_lookups_total{{{node0},result="hit"}}'
            wait_until(f"{STEPS * TENSORS * 2} mapping hits",
                       lambda: value(hits) == STEPS * TENSORS * 2)
            released = f'gradsync_mapping_cache_released_total{{{node0}}}'
            misses = f'gradsync_mapping_cache_lookups_total{{{node0},result="miss"}}'
            wait_until("the ranks' mappings released",
                       lambda: value(released) == value(misses) > 0)

            # A two-node job that stays busy while the dashboard is checked.
            nodes = f"127.0.0.1:{listen[0]},127.0.0.1:{listen[1]}"
            for n in range(2):
                processes.append(rank(sockets[n], "busy", n, 2, 0, 1, ["loop", "65536"],
                                      nodes, n))
            wait_until("allreduces across nodes show",
                       lambda: (value("sum(gradsync_internode_allreduces_total)") or 0) > 0)
            time.sleep(3)  # a few scrapes of the busy job, for rates
            # What node 0 says of the busy job and of its peer, node 1.
            peer = f'peer="127.0.0.1:{listen[1]}"'
            for series in (f'gradsync_peer_sent_bytes_total{{{node0},{peer}}}',
                           f'gradsync_peer_received_bytes_total{{{node0},{peer}}}',
                           f'gradsync_step_bus_bandwidth_bytes_per_second{{{node0},training_job="busy"}}',
                           f'gradsync_rank_completed_sequence{{{node0},training_job="busy",local_rank="0"}}',
                           f'gradsync_node_cycle_sequence{{{node0},training_job="busy",node="1"}}'):
                wait_until(f"{series} > 0", lambda: (value(series) or 0) > 0)
            assert value(f'gradsync_peer_errors_total{{{node0},{peer}}}') == 0
            assert value(f'gradsync_jobs{{{node0},state="running"}}') == 1

            # A second job, through the top-k codec: what it holds back shows (its 64 KiB
            # tensor's values), and its allreduces by their algorithm.
            for n in range(2):
                processes.append(rank(sockets[n], "sparse", n, 2, 0, 1, ["loop", "65536"],
                                      nodes, n, {"GRADSYNC_WIRE_CODEC": "topk:1"}))
            held = f'gradsync_topk_held_bytes{{{node0}}}'
            wait_until(f"{held} = 65536", lambda: value(held) == 65536)
            topk = f'gradsync_internode_allreduces_total{{{node0},algorithm="topk"}}'
            wait_until(f"{topk} > 0", lambda: (value(topk) or 0) > 0)
            assert value(f'gradsync_topk_evicted_tensors_total{{{node0}}}') == 0

            # A third job, its allreduces through the aggregator: the aggregator's figures for
            # it, and node 0's traffic to the aggregator, move.
            aggregator = f"127.0.0.1:{listen[2]}"
            for n in range(2):
                processes.append(rank(sockets[n], "summed", n, 2, 0, 1, ["loop", "1048576"],
                                      nodes, n, {"GRADSYNC_AGGREGATORS": aggregator,
                                                 "GRADSYNC_ALGO": "aggregate"}))
            for series in (f'gradsync_aggregator_chunks_summed_total{{training_job="summed"}}',
                           f'gradsync_aggregator_received_bytes_total{{training_job="summed"}}',
                           f'gradsync_aggregation_sent_bytes_total{{{node0},aggregator="{aggregator}"}}',
                           f'gradsync_internode_allreduces_total{{{node0},algorithm="aggregate"}}'):
                wait_until(f"{series} > 0", lambda: (value(series) or 0) > 0)
            time.sleep(3)  # a few scrapes of the summed job, for rates

            with open(f"{SOURCE}/monitoring/grafana/gradsync.json") as f:
                dashboard = json.load(f)
            checked = 0
            for panel in dashboard["panels"]:
                for target in panel["targets"]:
                    expr = (target["expr"].replace("$__rate_interval", "30s")
                            .replace("$instance", ".*"))
                    if not query(expr):
                        raise SystemExit(f"FAIL: panel '{panel['title']}' has no data: {expr}")
                    checked += 1
            print(f"{checked} dashboard queries return data")

            example = subprocess.run(["promtool", "check", "config",
                                      f"{SOURCE}/monitoring/prometheus.yml"],
                                     capture_output=True, text=True)
            assert example.returncode == 0, f"monitoring/prometheus.yml: {example.stderr}"

            scrape = get(f"http://127.0.0.1:{metrics[0]}/metrics")
            lint = subprocess.run(["promtool", "check", "metrics"], input=scrape, text=True,
                                  capture_output=True)
            assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), \
                f"promtool: {lint.stdout}{lint.stderr}"
            print("ok")
        finally:
            for p in reversed(processes):
                p.terminate()
            for p in reversed(processes):
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
