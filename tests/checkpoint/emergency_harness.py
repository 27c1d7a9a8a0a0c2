"""Start real 2-rank gloo jobs (one process per rank) and clean every one up by pid."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).resolve().parent / "emergency_job.py"
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
    """One training job: ``world`` rank processes of emergency_job.py, logs in files."""

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
        self.logs = [root / f"{name}-rank{r}.log" for r in range(world)]
        port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(world):
            full = dict(os.environ)
            full.update(
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "PYTHONUNBUFFERED": "1",
                    # A rank that hangs is sent SIGABRT before the kill: its log then shows
                    # where every thread of it was (see ``wait``).
                    "PYTHONFAULTHANDLER": "1",
                    **(env or {}),
                }
            )
            with open(self.logs[rank], "wb") as log:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(JOB), "--root", str(root), *args],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=full,
                        cwd=REPO,
                        start_new_session=True,
                    )
                )

    def signal(self, rank: int, sig: int) -> None:
        self.procs[rank].send_signal(sig)

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self._dump_stacks()
                self.kill()
                raise AssertionError(
                    f"job did not finish within {timeout} s; logs:\n{self.log()[-8000:]}"
                ) from None
        return codes

    def _dump_stacks(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGABRT)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def log(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.logs)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                kill_pid_group(proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)


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
