"""Start real 2-rank gloo jobs (one process per rank) and clean every one up by pid."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from zygote_client import RANK_GROUPS, start_python

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "emergency_job.py"
RANK_GROUP = Path(__file__).resolve().parent / "rank_group.py"
#: rank_group's own deadline for its ranks: above every test's wait, so the test's fails first.
RANKS_DEADLINE_S = 600
PREEMPTED = 75


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_pid_group(pid: int) -> None:
    """SIGKILL a process we started in its own session, and its session's other processes."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


class Job:
    """One training job: ``world`` ranks of emergency_job.py, forked by rank_group.py.

    rank_group.py imports torch once and forks the ranks (one import per job, not one per
    rank); it leads its own session, so killing that session kills the ranks and their writers.
    Logs are ``ROOT/NAME/rank<r>.log``.
    """

    def __init__(
        self,
        root: Path,
        args: list[str],
        *,
        world: int = 2,
        env: dict[str, str] | None = None,
        name: str = "job",
    ) -> None:
        self.root = root
        self.dir = root / name
        self.dir.mkdir()
        self.logs = [self.dir / f"rank{r}.log" for r in range(world)]
        self.world = world
        full = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            # A rank that hangs is sent SIGABRT before the kill: its log then shows where
            # every thread of it was (see ``wait``). Set in rank_group, inherited by the forks.
            "PYTHONFAULTHANDLER": "1",
            **(env or {}),
        }
        argv = [str(RANK_GROUP), str(world), str(self.dir), str(RANKS_DEADLINE_S)]
        argv += [",".join(["0"] * world), str(JOB), "--root", str(root), *args]
        self.group = start_python(RANK_GROUPS, argv, full, subprocess.PIPE, cwd=REPO)

    def pid(self, rank: int, timeout: float = 60) -> int:
        """The pid of ``rank`` (rank_group records it right after the fork)."""
        path = self.dir / f"rank{rank}.pid"
        deadline = time.monotonic() + timeout
        while not path.exists() or not path.read_text():
            if time.monotonic() > deadline or self.group.poll() is not None:
                raise AssertionError(f"no pid of rank {rank} in {path}:\n{self.log()[-4000:]}")
            time.sleep(0.02)
        return int(path.read_text())

    def signal(self, rank: int, sig: int) -> None:
        os.kill(self.pid(rank), sig)

    def wait(self, timeout: float) -> list[int]:
        """The ranks' exit codes (negative: killed by that signal); fails after ``timeout``."""
        try:
            head, _ = self.group.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._dump_stacks()
            self.kill()
            raise AssertionError(
                f"job did not finish within {timeout} s; logs:\n{self.log()[-8000:]}"
            ) from None
        text = head.decode(errors="replace")
        found = re.search(r"rank_group: exit codes \[([-\d, ]*)\]", text)
        assert found, f"rank_group gave no exit codes ({self.group.returncode}):\n{text}"
        return [int(c) for c in found.group(1).split(",")]

    def _dump_stacks(self) -> None:
        for rank in range(self.world):
            with contextlib.suppress(ProcessLookupError, AssertionError, ValueError):
                os.kill(self.pid(rank, timeout=0), signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.group.wait(5)

    def log(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.logs if p.exists()
        )

    def kill(self) -> None:
        kill_pid_group(self.group.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.group.wait(10)
        if self.group.stdout is not None:  # unread when the job was killed before ``wait``
            self.group.stdout.close()


def wait_for_files(directory: Path, pattern: str, count: int, timeout: float, job: Any) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list(directory.glob(pattern))) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {count} x {pattern} in {directory} within {timeout} s:\n{job.log()}")


def exit_infos(directory: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("rank_*.json"))}


def committed_steps(root: Path) -> list[int]:
    """Steps committed by the simple saver (COMMITTED) or the CheckpointManager (manifest)."""
    ckpt = root / "ckpt"
    found = [*ckpt.glob("step_*/COMMITTED"), *ckpt.glob("step_*/manifest.json")]
    return sorted({int(p.parent.name[5:]) for p in found})


def resumed_step(log: str) -> int:
    lines = [line for line in log.splitlines() if line.startswith("RESUMED ")]
    assert len(lines) == 1, log[-4000:]
    return int(lines[0].split()[1])


def noticed_steps(log: str) -> list[int]:
    """Steps at which a rank noticed a signal ('got SIGTERM at step N')."""
    return [int(m) for m in re.findall(r"got SIG\w+ at step (\d+);", log)]
