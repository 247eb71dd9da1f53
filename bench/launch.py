"""Where bench/compare runs things: one node (a private gradsyncd, ranks on this machine) or a
cluster of nodes on this machine: network namespaces (scripts/netns-cluster, one gradsyncd per
namespace with UCX on TCP over the namespace's veth) or, where namespaces cannot be made,
daemons on loopback ports. Each node's processes run on cores of their own where the machine
has enough (node_cores). Every process is started here and stopped here, whatever happens, so
a failed run leaves no daemon, namespace or socket behind."""
import json
import os
import random
import shutil
import signal
import subprocess
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = os.path.join(ROOT, "scripts", "netns-cluster")
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch and python3-mpi4py (--python)
DAEMON_PORT = 9478
TOPK_CODEC = "topk:1"  # gradsync_topk's: 1% of each tensor's chunks cross the nodes
# Cores kept off the nodes where the machine has many: for the launching processes, the
# kernel's network work that runs outside the nodes' processes, and the bridge.
SPARE_CORES = 4


def cores_per_node(nodes, requested=None):
    """How many cores each of `nodes` nodes gets: `requested`, or by default every core but
    SPARE_CORES shared out where that leaves each node at least 2 (16 cores: 2 nodes x 6,
    4 nodes x 3), else 1."""
    if requested:
        return requested
    return max(1, (os.cpu_count() - SPARE_CORES) // nodes) if os.cpu_count() >= 8 else 1


def node_cores(node, per_node):
    """The cores every process of node `node` runs on, as taskset's list: `per_node` cores of
    its own, node n from core n x per_node, wrapping where the machine has fewer. A real node
    has its own cores; left to the scheduler, the nodes here mix on this machine's cores, and
    whether two nodes' daemons happen to share one decides small-message latency (8 B across 2
    nodes: 21 us with each node on a core of its own, 37 us with both daemons on one, either
    one unpinned, for tens of seconds at a time). Every system's processes of a node get the
    same cores. bench/netns-rsh and bench/pin-rank pin Open MPI's processes to the same lists,
    which Place hands them in GRADSYNC_BENCH_NODE_CORES (bench/node-cores reads it)."""
    first = node * per_node
    return ",".join(str((first + i) % os.cpu_count()) for i in range(per_node))


def parse_scenario(name):
    """nodeNxK (one node, K ranks) or nsNxK[_RATE] (N namespace nodes, K ranks each, links
    shaped to RATE): (nodes, ranks per node, rate or None)."""
    shape, _, rate = name.partition("_")
    kind, _, per_node = shape.partition("x")
    if kind.startswith("node") and kind[4:] == "1" and not rate:
        return 1, int(per_node), None
    if kind.startswith("ns") and kind[2:].isdigit() and int(kind[2:]) >= 2:
        return int(kind[2:]), int(per_node), rate or None
    raise SystemExit(f"unknown scenario '{name}' (nodes 1 has no namespaces and no rate)")


def median_rows(rounds_of_rows, bus_factor):
    """Per size, the median over rounds of the time; bandwidths from that median, bus
    bandwidth as algbw x bus_factor (nccl-tests': 2(n-1)/n for an allreduce, 1 for a
    broadcast)."""
    out = []
    for i, row in enumerate(rounds_of_rows[0]):
        times = [rows[i]["time_us"] for rows in rounds_of_rows]
        time_us = statistics.median(times)
        algbw = row["bytes"] / time_us / 1e3
        out.append({"bytes": row["bytes"], "time_us": time_us, "algbw_gbps": algbw,
                    "busbw_gbps": algbw * bus_factor,
                    "wrong": sum(rows[i]["wrong"] for rows in rounds_of_rows),
                    "rounds_us": times})
    return out


class RunFailed(RuntimeError):
    pass


class Interrupted(Exception):
    """SIGTERM or SIGHUP: raised where the run is, so that every `with Place` unwinds and
    stops its daemons, ranks and namespaces (Python's default for both is to exit at once)."""

    def __init__(self, signo):
        super().__init__(f"stopped by signal {signo}")
        self.signo = signo


def raise_on_stop_signals():
    def stop(signo, _frame):
        raise Interrupted(signo)
    for signo in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signo, stop)


class Place:
    """N nodes x K ranks: one node on this machine, or N nodes on this machine, each a network
    namespace (network="netns") or a daemon on a loopback port of its own ("loopback": where
    namespaces cannot be made; ranks of different nodes then share the loopback device, and
    Open MPI is told to use TCP between all its ranks, as it cannot tell the nodes apart).
    `cores`: cores per node (None: cores_per_node's default); `python`: the interpreter with
    PyTorch and mpi4py for the peers; `metrics`: the daemons serve their metrics
    (metrics_address); `daemon_config`: the daemons' configuration file; `aggregators`: that
    many more namespaces after the nodes, each an aggregator's (docs/aggregators.md), which
    gradsync's jobs list in GRADSYNC_AGGREGATORS."""

    def __init__(self, nodes, per_node, rate, build, network="netns", cores=None,
                 python=PYTHON, metrics=False, daemon_config=None, aggregators=0):
        self.nodes, self.per_node, self.rate = nodes, per_node, rate
        self.aggregators = aggregators
        if aggregators and network != "netns":
            raise RunFailed("aggregators need namespace nodes")
        self.across = nodes > 1
        self.namespaces = self.across and network == "netns"
        if rate and not self.namespaces:
            raise RunFailed("shaped links need namespace nodes")
        self.build, self.python, self.metrics = build, python, metrics
        self.daemon_config = daemon_config
        self.cores = cores_per_node(nodes + aggregators, cores)
        self.dir = tempfile.mkdtemp(prefix="gradsync-compare-")
        # Every node's cores, "0,1;2,3;...", for the processes Open MPI starts.
        node_lists = ";".join(node_cores(n, self.cores) for n in range(nodes))
        self.env = dict(os.environ, GRADSYNC_NETNS_PREFIX=f"gscmp{os.getpid()}",
                        GRADSYNC_BENCH_NODE_CORES=node_lists)
        self.daemons = []

    # -- setup and teardown -------------------------------------------------------------
    def __enter__(self):
        try:
            if self.namespaces:
                if os.geteuid() != 0:
                    raise RunFailed("namespace nodes need root")
                up = [NETNS, "up", str(self.machines())]
                up += ["--rate", self.rate] if self.rate else []
                subprocess.run(up, env=self.env, check=True, stdout=subprocess.DEVNULL)
            for node in range(self.machines()):
                self._start_daemon(node)
            for node in range(self.machines()):
                self._wait_for_socket(node)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for daemon in self.daemons:
            daemon.send_signal(signal.SIGTERM)
        for daemon in self.daemons:
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        if self.namespaces:
            subprocess.run([NETNS, "down", str(self.machines())], env=self.env, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def machines(self):
        """The namespaces (or daemons) of the place: the nodes, then the aggregators."""
        return self.nodes + self.aggregators

    def aggregator_addresses(self):
        return ",".join(f"{self.address(a)}:{self.port(a)}"
                        for a in range(self.nodes, self.machines()))

    def address(self, node):
        return f"198.18.0.{node + 1}" if self.namespaces else "127.0.0.1"

    def port(self, node):
        return DAEMON_PORT + (0 if self.namespaces else node)

    def metrics_address(self, node):
        """Where node `node`'s daemon serves its metrics (with `metrics`), seen from the node."""
        return f"{self.address(node)}:{self.port(node) + 1000}"

    def interface(self):
        return "eth0" if self.namespaces else "lo"

    def ucx_across_nodes(self):
        """UCX on TCP over the nodes' interface: UCX would otherwise find the other "nodes"
        reachable by shared memory, which real nodes are not."""
        return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": self.interface()}

    def socket(self, node):
        return os.path.join(self.dir, f"node{node}.sock")

    def on_node(self, node, command, env=None):
        """`command` as it runs on `node`, with `env` set there: in the node's namespace, on
        the node's cores (see node_cores)."""
        prefix = []
        if self.namespaces:
            prefix = [NETNS, "exec", str(node)]
        if self.across:
            prefix += ["taskset", "-c", node_cores(node, self.cores)]
        pairs = [f"{k}={v}" for k, v in (env or {}).items()]
        return prefix + ["env"] + pairs + command

    def _start_daemon(self, node):
        command = [os.path.join(self.build, "gradsyncd"), "--socket", self.socket(node),
                   "--metrics-listen", self.metrics_address(node) if self.metrics else "",
                   "--log-level", "warn"]
        if self.daemon_config:
            command += ["--config", self.daemon_config]
        if node >= self.nodes:
            command += ["--role", "aggregator"]
        env = {}
        if self.across:
            command += ["--listen", f"{self.address(node)}:{self.port(node)}"]
            env = self.ucx_across_nodes()
        log = open(os.path.join(self.dir, f"daemon{node}.log"), "w")
        self.daemons.append(subprocess.Popen(self.on_node(node, command, env), env=self.env,
                                             stdout=log, stderr=subprocess.STDOUT))

    def _wait_for_socket(self, node):
        for _ in range(200):
            if os.path.exists(self.socket(node)):
                return
            time.sleep(0.05)
        raise RunFailed(f"gradsyncd of node {node} did not start: " +
                        open(os.path.join(self.dir, f"daemon{node}.log")).read())

    # -- ranks --------------------------------------------------------------------------
    def run_ranks(self, system, args, timeout):
        """Runs one rank per (node, local rank) of `system` ("gradsync", "gradsync_bf16": the
        job with the bf16 wire codec, "gradsync_topk": with the top-k codec at TOPK_CODEC,
        "gradsync_direct": with the direct broadcast forced, "gradsync_algo_NAME": with
        GRADSYNC_ALGO=NAME, "gloo", "mpi") with the benchmark arguments `args`; returns rank
        0's JSON (--json)."""
        out = os.path.join(self.dir, f"{system}-{random.getrandbits(32)}.json")
        args = list(args) + ["--json", out]
        if system.startswith("gradsync_algo_"):
            self._run_gradsync_ranks(["--check"] + args, timeout,
                                     {"GRADSYNC_ALGO": system[len("gradsync_algo_"):]})
        elif system == "mpi":
            self._wait_all([self._popen(self._mpirun(args))], timeout)
        elif system == "gradsync":
            self._run_gradsync_ranks(["--check"] + args, timeout)
        elif system == "gradsync_bf16":
            self._run_gradsync_ranks(["--check"] + args, timeout, {"GRADSYNC_WIRE_CODEC": "bf16"})
        elif system == "gradsync_direct":
            # A forced algorithm names the family: rhd's broadcast is the direct one.
            self._run_gradsync_ranks(["--check"] + args, timeout, {"GRADSYNC_ALGO": "rhd"})
        elif system == "gradsync_topk":
            # Unchecked: a sparse result is no allreduce's reference (the cluster test checks
            # the codec's rules).
            self._run_gradsync_ranks(args, timeout, {"GRADSYNC_WIRE_CODEC": TOPK_CODEC})
        elif system == "gloo":
            command = [self.python, os.path.join(ROOT, "bench", "gloo_allreduce.py")] + args
            self.run_on_every_rank(command, timeout)
        else:
            raise ValueError(system)
        return json.load(open(out))

    def run_model_step(self, steps, fused, timeout):
        """gradsync-bench --model resnet50 on every rank: 161 tensors per step, or (fused) one
        tensor of the same bytes; returns rank 0's JSON (the step time's median and spread)."""
        out = os.path.join(self.dir, f"model-{random.getrandbits(32)}.json")
        args = ["--model", "resnet50", "--steps", str(steps), "-w", "2", "--no-progress",
                "--check", "--json", out] + (["--fused"] if fused else [])
        self._run_gradsync_ranks(args, timeout)
        return json.load(open(out))

    def calibrate(self, large, timeout):
        """gradsync-bench --calibrate on every rank: what gradsync-model fits its figures to."""
        out = os.path.join(self.dir, "calibration.json")
        self._run_gradsync_ranks(["--calibrate", out, "-b", large, "-e", large], timeout)
        return json.load(open(out))

    def run_on_every_rank(self, command, timeout, env=None):
        """Runs `command` as every rank, each on its node with its identity (torchrun's
        variables, a store at node 0 for torch.distributed, Gloo on the nodes' interface), its
        node's daemon's socket and index and `env` set; raises RunFailed where one fails."""
        port = str(29500 + random.randrange(1000))
        self._wait_all([
            self._popen(self.on_node(node, command, dict(
                self._identity(node, local), MASTER_ADDR=self.address(0), MASTER_PORT=port,
                GLOO_SOCKET_IFNAME=self.interface(), GRADSYNC_SOCKET=self.socket(node),
                GRADSYNC_NODE_RANK=node, **(env or {}))))
            for node, local in self._ranks()], timeout)

    def _run_gradsync_ranks(self, args, timeout, job_env=None):
        command = [os.path.join(self.build, "gradsync-bench")] + args
        env = dict(GRADSYNC_JOB=f"compare{random.getrandbits(40)}", **(job_env or {}))
        if self.across:
            env["GRADSYNC_NODES"] = ",".join(f"{self.address(n)}:{self.port(n)}"
                                             for n in range(self.nodes))
        if self.aggregators:
            env["GRADSYNC_AGGREGATORS"] = self.aggregator_addresses()
        self.run_on_every_rank(command, timeout, env)

    def run_mpi(self, script, args, timeout):
        """Open MPI's launch of `script` (a Python file) with `args` on every rank."""
        self._wait_all([self._popen(self._mpirun(args, script))], timeout)

    def _mpirun(self, args, script=os.path.join(ROOT, "bench", "mpi_allreduce.py")):
        """Open MPI's launch of bench/mpi_allreduce.py on every rank. Across namespace nodes,
        mpirun runs on node 0 and starts its daemons on the others through bench/netns-rsh,
        each node under a hostname of its own; ranks on one node talk through shared memory,
        across nodes over TCP on eth0, as they would on real nodes. Across loopback nodes every
        rank talks over TCP, each pinned to its node's cores by bench/pin-rank."""
        command = ["mpirun", "--allow-run-as-root", "--bind-to", "none",
                   "-np", str(self.nodes * self.per_node)]
        python = [self.python, script] + list(args)
        if self.across and not self.namespaces:
            command += ["--oversubscribe", "--mca", "btl", "self,tcp",
                        "--mca", "btl_tcp_if_include", "lo",
                        os.path.join(ROOT, "bench", "pin-rank"), str(self.per_node)]
            return command + python
        if self.namespaces:
            hosts = ",".join(f"{self.address(n)}:{self.per_node}" for n in range(self.nodes))
            # Open MPI sees K slots per node, not 2 cores for every node together: told
            # nothing, its ranks would spin and starve each other (8 B in ms, not us) where
            # on one node it yields, being oversubscribed.
            # --oversubscribe: Open MPI 4.1.6 counted too few slots on node 0 from --host
            # alone (the GPU test machine's), where 4.1.4 counts K.
            command += ["--host", hosts, "--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
                        "--mca", "plm_rsh_agent", os.path.join(ROOT, "bench", "netns-rsh"),
                        "--mca", "btl_tcp_if_include", "eth0",
                        "--mca", "oob_tcp_if_include", "eth0"]
        else:
            command += ["--oversubscribe"]
        command += python
        # On namespace nodes, node 0 under its own host name (scripts/netns-cluster exec).
        return self.on_node(0, command) if self.namespaces else command

    def _ranks(self):
        return [(node, local) for node in range(self.nodes) for local in range(self.per_node)]

    def _identity(self, node, local):
        return {"RANK": node * self.per_node + local, "WORLD_SIZE": self.nodes * self.per_node,
                "LOCAL_RANK": local, "LOCAL_WORLD_SIZE": self.per_node}

    def _popen(self, command):
        return subprocess.Popen(command, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    @staticmethod
    def _wait_all(processes, timeout):
        deadline = time.monotonic() + timeout
        failed = []
        try:
            for p in processes:
                try:
                    _, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    _, err = p.communicate()
                    failed.append(f"timed out after {timeout} s\n{err}")
                    continue
                if p.returncode != 0:
                    failed.append(f"exit {p.returncode}\n{err}")
        finally:
            # A failed rank, or an interrupted run: none of its processes outlives it. SIGTERM
            # first, so that mpirun takes its ranks on the other nodes down with it.
            for p in processes:
                if p.poll() is None:
                    p.terminate()
            for p in processes:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if failed:
            raise RunFailed("a rank failed: " + "\n".join(failed))

    # -- the transport's ceiling --------------------------------------------------------
    def ucx_perftest(self, test, size, iterations):
        """ucx_perftest between node 0 and node 1 (or two processes here): the Final line's
        (average latency in us, average bandwidth in bytes/s)."""
        port = str(13337 + random.randrange(1000))
        env = self.ucx_across_nodes() if self.across else {}
        peer = 1 if self.across else 0
        server = subprocess.Popen(self.on_node(0, ["ucx_perftest", "-p", port], env),
                                  env=self.env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            client = subprocess.run(
                self.on_node(peer, ["ucx_perftest", self.address(0), "-p", port, "-t", test,
                                    "-s", str(size), "-n", str(iterations)], env),
                env=self.env, capture_output=True, text=True, timeout=120)
        finally:
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        final = [line for line in client.stdout.splitlines() if "Final:" in line]
        if client.returncode != 0 or not final:
            raise RunFailed(f"ucx_perftest {test} failed: {client.stderr.strip()}")
        fields = final[0].split()
        # Final: iterations, typical/avg/overall latency (us), avg/overall bandwidth (MB/s =
        # 2^20 B/s), msg rates.
        return float(fields[3]), float(fields[5]) * (1 << 20)

    def transport_rates(self, size, transfers, timeout=120):
        """gradsync-transport-bench between node 0 and node 1 (the daemons' transport with their
        settings, pieces as the ring's): GB/s one way, and a way when both send and receive at
        once from one thread (as a daemon's engine) and from two; and one way from memory never
        written, as ucx_perftest sends (its tag_bw's like). Node 0's received rates."""
        port = 14500 + random.randrange(1000)
        tool = os.path.join(self.build, "gradsync-transport-bench")
        common = ["--bytes", str(size), "--transfers", str(transfers), "--json",
                  "--piece", str(min(size, 4 << 20))]
        rates = {}
        for name, zero, one in (("one_way", ["--direction", "in"], ["--direction", "out"]),
                                ("both_ways_one_thread", [], []),
                                ("both_ways_two_threads", ["--threads", "2"], ["--threads", "2"]),
                                ("one_way_untouched",
                                 ["--direction", "in", "--send-memory", "untouched"],
                                 ["--direction", "out", "--send-memory", "untouched"])):
            port += 2
            sides = []
            for node, own, peer, args in ((0, port, port + 1, zero), (1, port + 1, port, one)):
                command = [tool, "--listen", f"{self.address(node)}:{own}",
                           "--peer", f"{self.address(1 - node)}:{peer}"] + common + args
                sides.append(subprocess.Popen(
                    self.on_node(node, command, self.ucx_across_nodes()), env=self.env,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            outputs = []
            for side in sides:
                try:
                    out, err = side.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    side.kill()
                    out, err = side.communicate()
                if side.returncode != 0:
                    for other in sides:
                        if other.poll() is None:
                            other.kill()
                            other.wait()
                    raise RunFailed(f"gradsync-transport-bench ({name}) failed: {err.strip()}")
                outputs.append(json.loads(out))
            rates[name] = outputs[0]["received_gbytes_per_s"]
        return rates


def log(message):
    print(message, file=sys.stderr, flush=True)
