"""Auto-resume loop: launch the same job again until it writes its finished flag.

This is what a cluster's job-chaining does (a Slurm job that requeues itself, a Kubernetes Job
that restarts): each job resumes from the last checkpoint, and the one that completes training
creates the file named by ``FAULT_TOL_FINISHED_FLAG_FILE`` (``FaultToleranceCallback(
autoresume=True)`` does it on rank 0). The loop stops on that flag, not on exit codes, so a job that
crashed after finishing, or that was told to shut down, is not relaunched.

    python examples/ptl_autoresume.py --flag-file run/finished.flag --max-jobs 5 -- \
        ft-launcher --nproc-per-node 2 --max-restarts 2 examples/ptl_train.py \
        --work-dir run --autoresume --calculate-timeouts
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flag-file", type=Path, required=True, help="the finished flag")
    parser.add_argument("--max-jobs", type=int, default=10, help="give up after this many jobs")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds between jobs")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the job command after --")
    env = {**os.environ, "FAULT_TOL_FINISHED_FLAG_FILE": str(args.flag_file.resolve())}

    child: subprocess.Popen[bytes] | None = None
    stop_requested = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    for job in range(1, args.max_jobs + 1):
        if args.flag_file.exists():
            print(f"[autoresume] finished flag {args.flag_file} exists; nothing to do", flush=True)
            return 0
        print(f"[autoresume] job {job}/{args.max_jobs}: {' '.join(command)}", flush=True)
        started = time.monotonic()
        child = subprocess.Popen(command, env=env)
        code = child.wait()
        child = None
        print(
            f"[autoresume] job {job} exited with code {code} after "
            f"{time.monotonic() - started:.1f} s",
            flush=True,
        )
        if args.flag_file.exists():
            print(f"[autoresume] finished flag found after job {job}; stopping", flush=True)
            return 0
        if stop_requested:
            print("[autoresume] stopped by a signal", flush=True)
            return 130
        time.sleep(args.delay)
    print(f"[autoresume] no finished flag after {args.max_jobs} jobs; giving up", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
