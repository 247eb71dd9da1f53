"""Nodes in network namespaces for the Python tests, through scripts/netns-cluster: node n has
an address of its own in 198.18.0.0/24 on a bridge, and a process runs on it when started with
`on(n, argv)`. Needs root; `available()` says whether it can run here.

    with NamespaceNodes(3) as nodes:
        subprocess.Popen(nodes.on(1, ["gradsyncd", "--listen", f"{nodes.address(1)}:9478"]))
"""
import os
import subprocess

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CLUSTER = os.path.join(ROOT, "scripts", "netns-cluster")
# UCX on a node as on a real one: TCP on its veth, no shared memory with the other "nodes".
NODE_UCX = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "eth0"}


def available():
    """True where namespaces can be made (root), else False, having said so."""
    if os.geteuid() == 0:
        return True
    print("skipped: namespace nodes need root (network namespaces)")
    return False


class NamespaceNodes:
    """`count` namespace nodes, up from `with` to its end (namespaces named after this process,
    so that concurrent tests' clusters do not meet). With `rate` (tc's, e.g. "1gbit"), each
    node's link is shaped to it."""

    def __init__(self, count, rate=None):
        self.count = count
        self.rate = rate
        self.prefix = f"gspy{os.getpid()}"

    def _cluster(self, *arguments):
        subprocess.run([CLUSTER, *arguments], check=True,
                       env=dict(os.environ, GRADSYNC_NETNS_PREFIX=self.prefix))

    def __enter__(self):
        self._cluster("up", str(self.count), *(["--rate", self.rate] if self.rate else []))
        return self

    def __exit__(self, *_):
        self._cluster("down", str(self.count))

    @staticmethod
    def address(node):
        return subprocess.run([CLUSTER, "address", str(node)], check=True, capture_output=True,
                              text=True).stdout.strip()

    def on(self, node, argv):
        """`argv` as a command run on node `node`."""
        return ["env", f"GRADSYNC_NETNS_PREFIX={self.prefix}", CLUSTER, "exec", str(node), *argv]
