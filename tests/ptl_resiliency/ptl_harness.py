"""Helpers for the Lightning callback tests: real monitors, real training subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from lightning_flavour import MODULE
from zygote_client import ForkedJob, start_python

from resiliency.ft import FaultToleranceConfig, MonitorProcess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
JOB = Path(__file__).resolve().parent / "ptl_train_job.py"
#: torch's rendezvous variables: a job started by a test is never a rank of the test's own job.
_RENDEZVOUS_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def _kill_group(proc: subprocess.Popen[Any] | ForkedJob) -> None:
    """Kill a process we started and its descendants (it leads its own session)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"process {proc.pid} survived SIGKILL for 10 s")


def zygote_modules() -> tuple[str, ...]:
    """What the job zygote imports: what every job script imports before it trains."""
    return ("torch", MODULE, "torch.distributed.checkpoint", "torch._dynamo", "resiliency.ptl")


class Jobs:
    """Starts training jobs (each in its own session) and kills them at teardown.

    Each is ``python ARGV`` in ROOT (a script: a job's, an example or a console script), forked
    from a zygote that imported Lightning once (tests/zygote.py), unless its ``PYTHON*``
    variables need a fresh interpreter.
    """

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any] | ForkedJob] = []

    def start(
        self, argv: list[str], env: dict[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen[Any] | ForkedJob:
        """Start ``python ARGV``; its output is read by ``finish``, or goes to ``log``."""
        inherited = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS_VARS}
        full_env = {**inherited, "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log, "wb") if log else contextlib.nullcontext(subprocess.PIPE) as out:
            proc = start_python(zygote_modules(), argv, full_env, out, text=True, cwd=ROOT)
        self.procs.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen[Any] | ForkedJob, timeout: float) -> tuple[int, str]:
        """Wait for the process; on timeout kill it and fail with its output."""
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, _ = proc.communicate()
            pytest.fail(f"job {proc.args} did not finish in {timeout} s; output:\n{out[-6000:]}")
        return proc.returncode, out

    def run(
        self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 90.0
    ) -> tuple[int, str]:
        return self.finish(self.start(argv, env), timeout)

    def kill_all(self) -> None:
        for proc in self.procs:
            _kill_group(proc)
            if isinstance(proc, ForkedJob):
                proc.release()
            elif proc.stdout is not None:
                proc.stdout.close()


class Monitors:
    """Starts real rank monitors (``resiliency.ft.MonitorProcess``) and stops them at teardown."""

    def __init__(self, sock_dir: Path) -> None:
        self.sock_dir = sock_dir
        self.started: list[Any] = []

    def start(self, local_rank: int = 0, **cfg_kwargs: Any) -> Any:
        cfg = FaultToleranceConfig(**cfg_kwargs)
        # One private directory per monitor: tests may run several jobs side by side.
        sock = self.sock_dir / f"m{len(self.started)}" / f"rank-{local_rank}.sock"
        mon = MonitorProcess.start(cfg, str(sock), local_rank, start_timeout=60)
        self.started.append(mon)
        return mon

    def stop_all(self) -> None:
        for mon in self.started:
            mon.stop(timeout=5.0)


def wait_for_event(mon: Any, kind: str, timeout: float, seen: list[Any] | None = None) -> Any:
    """Poll a monitor until an event of ``kind`` arrives; fail after ``timeout`` seconds."""
    seen = [] if seen is None else seen
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in mon.poll_events(timeout=0.2):
            seen.append(event)
            if event.kind == kind:
                return event
    pytest.fail(f"no {kind!r} event from the monitor within {timeout} s; got {seen}")


def job_result(output: str) -> dict[str, Any]:
    """The ``PTL_TRAIN_RESULT`` line rank 0 of the example prints at the end."""
    lines = [line for line in output.splitlines() if line.startswith("PTL_TRAIN_RESULT ")]
    assert len(lines) == 1, output[-4000:]
    return json.loads(lines[0].split(" ", 1)[1])
