"""Start the ranks of a multi-process test job and wait for them, without importing torch.

    python rank_group.py WORLD OUT DEADLINE_S EXPECTED_CODES WORKER [ARGS...]

Starts WORLD copies of ``python WORKER ARGS...``, each with torch's env:// rendezvous variables
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` on a free loopback port), logging into
``OUT/rank<r>.log``. Waits at most DEADLINE_S for all of them, kills any left by pid, and exits 0
when the ranks' exit codes are EXPECTED_CODES (comma-separated, one per rank; ``0`` alone means
every rank 0), else 1, after printing them.

This process only starts and waits: it imports nothing heavy, so a test pays for torch's import
in the ranks alone (one import less per job, ~3 s on a 2-core machine). A test that needs its
ranks in one mount namespace runs this script under ``unshare``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def run(world: int, out: Path, deadline_s: float, argv: list[str]) -> list[int]:
    """Run ``argv`` as ranks 0..world-1; return their exit codes (-9: killed at the deadline)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(world):
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            with open(out / f"rank{rank}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, *argv], env=env, stdout=log, stderr=subprocess.STDOUT
                    )
                )
        deadline = time.monotonic() + deadline_s
        codes = []
        for rank, proc in enumerate(procs):
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                print(f"rank_group: rank {rank} (pid {proc.pid}) still running at {deadline_s} s")
                os.kill(proc.pid, signal.SIGKILL)
                codes.append(proc.wait(10))
        return codes
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


def main() -> int:
    world, out, deadline_s, expected = sys.argv[1:5]
    codes = run(int(world), Path(out), float(deadline_s), sys.argv[5:])
    want = [int(c) for c in expected.split(",")]
    if want == [0]:
        want = [0] * int(world)
    print(f"rank_group: exit codes {codes} (expected {want})")
    return 0 if codes == want else 1


if __name__ == "__main__":
    sys.exit(main())
