"""Fixtures for ft-core tests: real monitor subprocesses, real rank subprocesses, cleaned up by pid.

A rank is a Python script run as its own process; it talks to its monitor through
RankMonitorClient exactly as a training rank would. Every process a test starts is killed by pid
at teardown, and every wait has a timeout, so a broken monitor fails a test instead of hanging it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.control import MonitorEvent, MonitorProcess
from resiliency.ft.socket_dir import create_socket_dir

# Short timeouts keep the tests fast; the initial timeout stays generous because importing the
# client (pydantic) in a fresh interpreter takes a while on a loaded 2-core machine.
FAST_CONFIG: dict[str, Any] = {
    "initial_rank_heartbeat_timeout": 20.0,
    "rank_heartbeat_timeout": 20.0,
    "workload_check_interval": 1.0,
    "stack_dump_timeout": 1.0,
    "termination_grace_period": 1.0,
}

#: Imported by every rank script before its own code.
RANK_PRELUDE = """
import os, signal, sys, time
from resiliency.ft import RankMonitorClient
client = RankMonitorClient()
client.init_workload_monitoring()
"""


@dataclass
class Monitor:
    """A monitor subprocess, its controller handle and its captured log."""

    proc: MonitorProcess
    log_path: Path
    events: list[MonitorEvent] = field(default_factory=list)

    @property
    def socket_path(self) -> Path:
        return self.proc.socket_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_event(self, kind: str, timeout: float = 15.0, pid: int | None = None) -> MonitorEvent:
        """Wait for an event of ``kind`` (optionally for ``pid``); all events land in .events."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event.kind == kind and (pid is None or event.pid == pid):
                    return event
            seen = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0:
                kinds = [e.kind for e in self.events]
                raise AssertionError(
                    f"no {kind!r} event within {timeout} s (got {kinds}); "
                    f"monitor log:\n{self.log()}"
                )
            self.events.extend(self.proc.poll_events(min(left, 0.5)))

    def wait_exited(self, timeout: float = 10.0) -> None:
        """Wait until the monitor process is gone (after a kill); fail naming it otherwise."""
        deadline = time.monotonic() + timeout
        while self.proc.is_alive():
            if time.monotonic() > deadline:
                raise AssertionError(f"monitor pid {self.proc.pid} still alive after {timeout} s")
            time.sleep(0.01)

    def drain(self, duration: float) -> list[MonitorEvent]:
        """Collect events for ``duration`` seconds; return all events seen so far."""
        deadline = time.monotonic() + duration
        while (left := deadline - time.monotonic()) > 0:
            self.events.extend(self.proc.poll_events(min(left, 0.2)))
        return self.events


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A fresh private (0700) directory with a short path, removed afterwards."""
    path = create_socket_dir("ft-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_monitor(sock_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Monitor]]:
    """Start monitors with FAST_CONFIG overridden by keyword arguments; stopped at teardown."""
    started: list[Monitor] = []

    def start(local_rank: int = 0, **overrides: Any) -> Monitor:
        cfg = FaultToleranceConfig(**{**FAST_CONFIG, **overrides})
        log_path = tmp_path / f"monitor-{local_rank}-{len(started)}.log"
        with open(log_path, "wb") as log:
            # 10 s, the default, is a real node's; 4 xdist workers on 2 cores at load 14 took
            # longer to start a monitor's interpreter.
            proc = MonitorProcess.start(
                cfg, sock_dir / f"rank-{local_rank}.sock", local_rank, stderr=log, start_timeout=60
            )
        monitor = Monitor(proc, log_path)
        started.append(monitor)
        return monitor

    yield start
    for monitor in started:
        monitor.proc.stop(timeout=2.0)
        if monitor.proc.is_alive():
            os.kill(monitor.proc.pid, signal.SIGKILL)


@dataclass
class Rank:
    """A rank subprocess and its captured output."""

    popen: subprocess.Popen[bytes]
    out_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = 30.0) -> None:
        """Poll ``ready`` until true; fail naming ``what`` if the rank exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"rank pid {self.pid} exited ({self.popen.returncode}) before {what}; "
                    f"output:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"rank pid {self.pid}: no {what} within {timeout} s; output:\n{self.output()}"
                )
            time.sleep(0.02)

    def wait_for_file(self, path: Path, timeout: float = 30.0) -> None:
        """Wait for a marker file the rank creates."""
        self.wait_for(f"marker file {path.name}", path.exists, timeout)

    def wait_for_output(self, text: str, timeout: float = 30.0) -> None:
        """Wait for ``text`` in the rank's captured output (printed with flush=True)."""
        self.wait_for(f"{text!r} in its output", lambda: text in self.output(), timeout)

    def wait(self, timeout: float = 15.0) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"rank pid {self.pid} still runs after {timeout} s; output:\n{self.output()}"
            ) from None


@pytest.fixture
def spawn_rank(tmp_path: Path) -> Iterator[Callable[..., Rank]]:
    """Run a rank script (RANK_PRELUDE + code unless prelude=False) against a monitor.

    The monitor is told the worker's pid right after the spawn (as the launcher does), which arms
    the initial-heartbeat timer before the script has imported anything.
    """
    ranks: list[Rank] = []

    def spawn(
        code: str,
        monitor: Monitor | None,
        *,
        rank: int = 0,
        restart: int = 0,
        prelude: bool = True,
        announce: bool = True,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> Rank:
        script = tmp_path / f"rank_{len(ranks)}.py"
        script.write_text((RANK_PRELUDE if prelude else "") + textwrap.dedent(code))
        out_path = tmp_path / f"rank_{len(ranks)}.out"
        full_env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", **(env or {})}
        if monitor is not None:
            full_env["FT_RANK_MONITOR_IPC_SOCKET"] = str(monitor.socket_path)
        with open(out_path, "wb") as out:
            popen = subprocess.Popen(
                [sys.executable, str(script), *args],
                cwd=tmp_path,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        ranks.append(Rank(popen, out_path))
        if monitor is not None and announce:
            monitor.proc.worker_started(popen.pid, rank=rank, restart=restart)
        return ranks[-1]

    yield spawn
    for rank in ranks:
        if rank.popen.poll() is None:
            rank.popen.kill()
        try:
            rank.popen.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(rank.pid, signal.SIGKILL)
