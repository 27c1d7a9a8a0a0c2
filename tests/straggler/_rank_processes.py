"""Run one worker script as the ranks of a job (one process each) and check they all succeed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the job's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(
    worker: Path,
    world: int,
    args: Callable[[int], list[str]],
    deadline_s: float,
    env: Callable[[int], dict[str, str]] | None = None,
) -> dict[int, str]:
    """Run ``python WORKER *args(rank)`` for every rank; return each rank's output.

    Every process is killed by pid when the deadline passes or a check fails.

    Raises:
        AssertionError: a rank failed; its exit code and the end of its output are shown.
    """
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), *args(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=None if env is None else env(rank),
        )
        for rank in range(world)
    ]
    logs = {}
    try:
        deadline = time.monotonic() + deadline_s
        for rank, proc in enumerate(procs):
            output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs[rank] = output.decode(errors="replace")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    failed = {r: p.returncode for r, p in enumerate(procs) if p.returncode != 0}
    assert not failed, f"workers failed {failed}:\n" + "\n".join(
        f"--- rank {r}\n{logs.get(r, '')[-3000:]}" for r in failed
    )
    return logs
