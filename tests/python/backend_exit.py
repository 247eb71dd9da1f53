"""A rank leaves the interpreter with a call in flight whose future has a Python callback: the
package's exit hook runs the call to its end first (the callback with it), and the process
exits as it asked, rather than aborting in the interpreter's finalization. Run by
run_ranks.py; exit status 0 on every rank when the callback ran with the right sum."""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
import gradsync.torch  # noqa: E402,F401  (registers the backend)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-file", required=True)
    args = parser.parse_args()
    try:
        gradsync.torch._backend.load_extension()
    except ImportError as error:
        print(f"skipped: {error}", flush=True)
        return 77
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gradsync", init_method=f"file://{args.init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=30))
    dist.barrier()
    if rank == 0:
        tensor = torch.ones(1 << 16)
        work = dist.all_reduce(tensor, async_op=True)

        def check(future):
            # The process's status comes from here: os._exit, as sys.exit cannot be raised
            # from a callback.
            total = future.value()[0]
            correct = bool(torch.all(total == world))
            print(f"rank 0: the callback ran; the sum is {'right' if correct else 'wrong'}",
                  flush=True)
            if not correct:
                os._exit(1)

        work.get_future().then(check)
        return 0  # leaves with the allreduce in flight: the other ranks join it later
    time.sleep(1.0)
    tensor = torch.ones(1 << 16)
    dist.all_reduce(tensor)
    return 0 if bool(torch.all(tensor == world)) else 1


if __name__ == "__main__":
    sys.exit(main())
