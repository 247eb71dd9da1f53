#!/usr/bin/python3
"""python3 -m gradsync.run: a rendezvous setting out of range is refused with an error naming it,
before any worker starts; torchrun's --redirects and --tee parse (PyTorch 1.13 on Python 3.11
cannot) and a worker's output reaches the terminal.

    gradsync_run_options.py
"""
import os
import subprocess
import sys
import tempfile

from run_ranks import SKIPPED, free_port, torch_missing

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python")


def gradsync_run(arguments, script):
    """One gradsync.run of `script` (Python source) on this machine: (exit status, output)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py") as worker:
        worker.write(script)
        worker.flush()
        run = subprocess.run(
            [sys.executable, "-m", "gradsync.run", "--nnodes", "1", "--nproc_per_node", "1",
             "--rdzv_backend", "gradsync", "--rdzv_endpoint", f"127.0.0.1:{free_port()}",
             "--rdzv_id", "options", *arguments, worker.name],
            env=dict(os.environ, PYTHONPATH=PACKAGE), capture_output=True, text=True, timeout=120)
    return run.returncode, run.stdout + run.stderr


def main():
    if torch_missing():
        return SKIPPED
    failures = []
    code, output = gradsync_run(["--rdzv_conf", "keep_alive_interval=0"],
                                "print('worker started')")
    if code == 0 or "keep_alive_interval (0 s)" not in output or "worker started" in output:
        failures.append(f"keep_alive_interval=0: exit {code}, output:\n{output}")
    code, output = gradsync_run(["--redirects", "3", "--tee", "0:3"],
                                "import sys; print('out'); print('err', file=sys.stderr)")
    if code != 0 or "[default0]:out" not in output or "[default0]:err" not in output:
        failures.append(f"--redirects 3 --tee 0:3: exit {code}, output:\n{output}")
    for failure in failures:
        print(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
