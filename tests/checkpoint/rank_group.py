"""Start the ranks of a multi-process test job, forked from one pre-imported process, and wait.

    python rank_group.py WORLD OUT DEADLINE_S EXPECTED_CODES WORKER [ARGS...]

Imports torch once (``RANK_GROUP_PREIMPORT``, comma-separated modules, default ``torch``; empty
for none), then forks WORLD ranks that each run ``WORKER ARGS...`` as ``__main__``, with torch's
env:// rendezvous variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` on a free
loopback port), their output in ``OUT/rank<r>.log`` and their pids in ``OUT/rank<r>.pid``.
``RANK_GROUP_ENVS``, a JSON list of one object per rank, adds (or overrides) variables per rank,
e.g. each "node's" own directory.

This is how ``ft-launcher --ft-preimport`` starts workers: a job pays torch's import once (2-4 s
of CPU on a 2-core machine) instead of once per rank. Waits at most DEADLINE_S for all ranks,
kills any left by pid, and exits 0 when the ranks' exit codes are EXPECTED_CODES
(comma-separated, one per rank; ``0`` alone means every rank 0), else 1, after printing them.

The ranks stay in this process's process group (a harness that kills the group kills them),
and this process stays single-threaded until it forks (a fork from a process with threads can
deadlock the child). A test that needs its ranks in one mount namespace runs this script under
``unshare``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/, for forked_script
from forked_script import run_script_and_exit

PREIMPORT_ENV = "RANK_GROUP_PREIMPORT"
RANK_ENVS_ENV = "RANK_GROUP_ENVS"
#: How often the parent looks for ended ranks (a poll, not a wait on the wall clock).
_POLL_S = 0.05


def _returncode(status: int) -> int:
    """A wait status as ``Popen.returncode`` gives it (negative: killed by that signal)."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _rank_main(env: dict[str, str], log: Path, argv: list[str]) -> None:
    """In the forked child: become ``python WORKER ARGS`` with ``env``; never returns."""
    try:
        os.environ.update(env)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    run_script_and_exit(argv)


def run(world: int, out: Path, deadline_s: float, argv: list[str]) -> list[int]:
    """Run ``argv`` (a script and its args) as ranks 0..world-1; return their exit codes.

    A rank still running at the deadline is SIGKILLed (its code is then -9).
    """
    extra = json.loads(os.environ.get(RANK_ENVS_ENV) or "[]") or [{}] * world
    if len(extra) != world or not all(isinstance(e, dict) for e in extra):
        raise SystemExit(f"rank_group: {RANK_ENVS_ENV} must list {world} objects, got {extra!r}")
    for name in filter(None, os.environ.get(PREIMPORT_ENV, "torch").split(",")):
        importlib.import_module(name)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pids: list[int] = []
    codes: dict[int, int] = {}
    try:
        for rank in range(world):
            env = {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                **{str(k): str(v) for k, v in extra[rank].items()},
            }
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _rank_main(env, out / f"rank{rank}.log", argv)
            pids.append(pid)
            (out / f"rank{rank}.pid").write_text(str(pid))  # for a test that signals one rank
        deadline = time.monotonic() + deadline_s
        while len(codes) < world and time.monotonic() < deadline:
            for rank, pid in enumerate(pids):
                if rank not in codes:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        codes[rank] = _returncode(status)
            if len(codes) < world:
                time.sleep(_POLL_S)
        for rank, pid in enumerate(pids):
            if rank not in codes:
                print(f"rank_group: rank {rank} (pid {pid}) still running at {deadline_s} s")
                os.kill(pid, signal.SIGKILL)
                codes[rank] = _returncode(os.waitpid(pid, 0)[1])
        return [codes[rank] for rank in range(world)]
    finally:
        for rank, pid in enumerate(pids):
            if rank not in codes:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def main() -> int:
    world, out, deadline_s, expected = sys.argv[1:5]
    codes = run(int(world), Path(out), float(deadline_s), sys.argv[5:])
    want = [int(c) for c in expected.split(",")]
    if want == [0]:
        want = [0] * int(world)
    print(f"rank_group: exit codes {codes} (expected {want})")
    return 0 if codes == want else 1


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)  # skips the interpreter's teardown of torch (seconds on a busy machine)
