"""torchrun, with a rendezvous that notices a lost node in seconds.

    python3 -m gradsync.run --nnodes 2:4 --nproc_per_node 8 --max_restarts 3 \\
        --rdzv_backend gradsync --rdzv_endpoint HOST:PORT --rdzv_id JOB train.py ...

Every argument is torchrun's (torch.distributed.run). What this adds is one rendezvous backend,
`gradsync`: torchrun's c10d rendezvous (the store on HOST:PORT, no etcd) whose agents send a
keep-alive heartbeat every `keep_alive_interval` seconds and drop a node that missed
`keep_alive_max_attempt` of them in a row, both set in --rdzv_conf.

Why: when a node dies, the survivors' workers fail within gradsync's peer timeout and torchrun
restarts them, but the re-formed rendezvous waits until the dead node's agent is dropped from it.
PyTorch fixes that at 3 missed heartbeats 5 s apart, so every re-formation waits 15 s; here it
waits 3 s by default. For the same reason torchrun's --monitor_interval (how often an agent
looks at its workers) defaults to 1 s here rather than 5 s.

It also repairs PyTorch 1.13's torchrun on Python 3.11, which cannot parse --redirects and
--tee, not even their defaults (Python 3.11's enum iteration leaves out the flag values 0 and
3 that its parser looks for): here they parse, and neither needs giving.
"""
import os
import re
import sys
from datetime import timedelta

BACKEND = "gradsync"
KEEP_ALIVE_INTERVAL_S = 1
KEEP_ALIVE_MAX_ATTEMPT = 3


def create_handler(params):
    """The rendezvous handler for --rdzv_backend gradsync (torch's registry calls this)."""
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    interval = params.get_as_int("keep_alive_interval", KEEP_ALIVE_INTERVAL_S)
    attempts = params.get_as_int("keep_alive_max_attempt", KEEP_ALIVE_MAX_ATTEMPT)
    if interval < 1 or attempts < 1:
        raise ValueError(f"gradsync.run: keep_alive_interval ({interval} s) and "
                         f"keep_alive_max_attempt ({attempts}) must be at least 1")
    backend, store = c10d_rendezvous_backend.create_backend(params)
    timeout = dynamic.RendezvousTimeout(*(dynamic._get_timeout(params, name)
                                          for name in ("join", "last_call", "close")))
    settings = dynamic.RendezvousSettings(params.run_id, params.min_nodes, params.max_nodes,
                                          timeout, keep_alive_interval=timedelta(seconds=interval),
                                          keep_alive_max_attempt=attempts)
    # What DynamicRendezvousHandler.from_backend builds, with these settings instead of its own.
    node = dynamic.DynamicRendezvousHandler._node_desc_generator.generate()
    state = dynamic._BackendRendezvousStateHolder(backend, settings)
    return dynamic.DynamicRendezvousHandler(node, settings, BACKEND, store, state)


def _repair_std_parsing():
    """torchrun's --redirects and --tee parsed by value where its own parser returns None."""
    from torch.distributed.elastic.multiprocessing.api import Std
    try:
        if Std.from_str("0") is not None and Std.from_str("3") is not None:
            return
    except ValueError:
        pass
    parse = Std.from_str

    def from_str(cls, value):
        if re.fullmatch(r"[0-3]", value):
            return cls(int(value))
        if re.fullmatch(r"\d+:[0-3](,\d+:[0-3])*", value):
            return {int(rank): cls(int(std))
                    for rank, std in (pair.split(":") for pair in value.split(","))}
        return parse(value)  # its error for anything else

    Std.from_str = classmethod(from_str)


def register():
    """Makes --rdzv_backend gradsync known to torch.distributed.elastic in this process."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    rendezvous_handler_registry.register(BACKEND, create_handler)


def main(args=None):
    from torch.distributed import run
    register()
    _repair_std_parsing()
    args = list(sys.argv[1:] if args is None else args)
    if "PET_MONITOR_INTERVAL" not in os.environ and not any(
            arg.startswith(("--monitor_interval", "--monitor-interval")) for arg in args):
        args = ["--monitor_interval", "1", *args]
    run.main(args)


if __name__ == "__main__":
    sys.exit(main())
