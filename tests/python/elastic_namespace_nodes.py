#!/usr/bin/python3
"""A node lost and regained on three namespace nodes (root), each with its own address, host
name, daemon and gradsync.run agent (`--nnodes 2:3`, one worker each), training
examples/train_elastic.py. Node 2 dies mid-training (agent, worker and daemon SIGKILLed): the
job re-forms on nodes 0 and 1 from the last checkpoint. Node 2 comes back and is admitted: the
job re-forms on all three. Training ends at the step count asked for, and its parameters equal
(to the last bits of a float's sums) those of a reference that replays the same membership
without any failure: one plain run per
membership, each from the checkpoint the one before left, for the steps the elastic run
trained with it.

    elastic_namespace_nodes.py --build-dir build
"""
import argparse
import os
import re
import sys
import tempfile
import time

import namespace_nodes
from elastic_nodes import Agent, describe, lose_node, stop_all, wait_until
from run_ranks import SKIPPED, launcher_environment, start_daemon, torch_missing

NODES = 3
STEPS = 160
DAEMON_PORT = 9478
RENDEZVOUS_PORT = 29400
DIGEST = re.compile(r"done: \d+ steps, parameter digest (\S+)")


def digest(agents):
    """The parameter digest rank 0 printed at the end, whichever node it was on."""
    found = [m.group(1) for agent in agents for _, line in agent.lines
             for m in [DIGEST.search(line)] if m]
    if len(found) != 1:
        raise RuntimeError(f"expected one final digest, found {found}")
    return float(found[0])


def segments(starts, steps):
    """(world size, from step, to step) of each stretch of training in `starts` (node 0's
    workers' starts: rank, world size, from step) that moved the checkpoint on."""
    ends = [start for _, _, start in starts[1:]] + [steps]
    return [(world, start, end) for (_, world, start), end in zip(starts, ends) if end > start]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    args = parser.parse_args()
    if torch_missing() or not namespace_nodes.available():
        return SKIPPED
    build_dir = os.path.abspath(args.build_dir)
    with tempfile.TemporaryDirectory() as directory, \
            namespace_nodes.NamespaceNodes(NODES) as nodes:
        base = launcher_environment(build_dir)
        daemons = []
        agents = []

        def start_node_daemon(node):
            return start_daemon(build_dir, directory, node, nodes=nodes,
                                listen=f"{nodes.address(node)}:{DAEMON_PORT}")

        def start_agent(node, run, checkpoint, nnodes, steps=STEPS):
            """Node `node`'s agent of run `run` (0: the elastic one), whose rendezvous node 0
            hosts on a port of its own (the runs before may leave theirs in TIME_WAIT)."""
            endpoint = f"{nodes.address(0)}:{RENDEZVOUS_PORT + run}"
            agent = Agent(dict(base, GRADSYNC_SOCKET=daemons[node][1]), endpoint, f"run{run}",
                          checkpoint, nnodes=nnodes, per_node=1, steps=steps,
                          on=lambda argv: nodes.on(node, argv))
            agents.append(agent)
            return agent

        try:
            daemons.extend(start_node_daemon(node) for node in range(NODES))
            checkpoint = os.path.join(directory, "elastic.pt")
            elastic = [start_agent(node, 0, checkpoint, "2:3") for node in range(NODES)]
            wait_until(lambda: any(world == 3 for _, world, _ in elastic[0].starts()), 120,
                       "the job to form on three nodes")
            time.sleep(1.5)

            lost_at = time.monotonic()
            lose_node(elastic[2], daemons[2][0])
            wait_until(lambda: elastic[0].starts()[-1][1] == 2, 60,
                       "the job to re-form on nodes 0 and 1")
            lost = elastic[0].restart_after(lost_at)
            time.sleep(1.5)

            # Node 2 comes back: a new daemon on its address, a new agent.
            daemons[2] = start_node_daemon(2)
            elastic.append(start_agent(2, 0, checkpoint, "2:3"))
            wait_until(lambda: elastic[0].starts()[-1][1] == 3, 60, "node 2 to be admitted")
            wait_until(lambda: all(agent.process.poll() is not None
                                   for agent in elastic[:2] + elastic[3:]), 120,
                       "training to end")
            codes = [agent.process.returncode for agent in elastic[:2] + elastic[3:]]
            elastic_digest = digest(elastic)
            starts = elastic[0].starts()

            # The reference: each membership in turn, without failures, on as many nodes.
            reference = os.path.join(directory, "reference.pt")
            for index, (world, start, end) in enumerate(segments(starts, STEPS)):
                runs = [start_agent(node, index + 1, reference, str(world), steps=end)
                        for node in range(world)]
                wait_until(lambda: all(run.process.poll() is not None for run in runs), 120,
                           f"reference run {index} ({world} nodes, steps {start}-{end})")
                if any(run.process.returncode != 0 for run in runs):
                    raise RuntimeError(f"reference run {index} failed")
            reference_digest = digest(runs)
        finally:
            stop_all(agents, daemons)
    print(f"elastic agents exited with {codes}; node 0's starts (rank, world, from step): "
          f"{starts}; node 2 lost: {describe(lost)}")
    print(f"parameter digest: elastic {elastic_digest}, reference {reference_digest}")
    worlds = [world for _, world, _ in starts]
    if codes != [0, 0, 0] or worlds[-2:] != [2, 3]:
        print("the job did not re-form on two nodes and then on three")
        return 1
    # An allreduce across nodes adds the nodes' sums in the order of the path it takes (with
    # the negotiation, or the ring's or halving-doubling's, as the measured link figures
    # choose), so two runs may differ in the last bits; a step lost or taken twice moves the
    # digest by thousands of times this much.
    if abs(elastic_digest - reference_digest) > 1e-6 * abs(reference_digest):
        print("the parameters differ from the reference's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
