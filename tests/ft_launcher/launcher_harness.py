"""Run real ft-launcher processes in tests, and clean every process up by pid at teardown."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from zygote_client import LAUNCHERS, start_python

WORKER = Path(__file__).parent / "workers" / "ft_worker.py"
REPO = Path(__file__).resolve().parents[2]

# Small timeouts so a hang is found in about a second; the initial timeout leaves room for
# python start-up on a loaded 2-core machine.
FAST_FT_FLAGS = [
    "--monitor-interval",
    "0.1",
    "--ft-workload-check-interval",
    "0.1",
    "--ft-initial-rank-heartbeat-timeout",
    "10",
    "--ft-rank-heartbeat-timeout",
    "1.5",
    "--ft-stack-dump-timeout",
    "0.5",
    "--ft-termination-grace-period",
    "1",
    "--workers-stop-timeout",
    "2",
    "--no-gpu-health-check",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Launcher:
    """One ft-launcher process (in its own process group) with its log in a file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        full_env = dict(os.environ)
        full_env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        full_env["PYTHONUNBUFFERED"] = "1"
        if env:
            full_env.update(env)
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in kill()/wait()
        # Forked from a zygote that imported torch's elastic agent once: `python -m
        # resiliency.launcher` in its own session, minus 2 s of imports (tests/zygote.py).
        self.proc = start_python(
            LAUNCHERS, ["-m", "resiliency.launcher", *args], full_env, self._log, cwd=REPO
        )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"ft-launcher did not exit within {timeout} s; log:\n{self.log()[-6000:]}"
            ) from None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not in the launcher log; log:\n{self.log()[-6000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()


def worker_pids(marker_dir: Path) -> list[int]:
    """Pids of every worker the markers recorded (start-<rank>-<attempt>-<pid>)."""
    return [int(p.name.rsplit("-", 1)[1]) for p in marker_dir.glob("start-*")]


def child_pids(marker_dir: Path) -> list[int]:
    return [int(p.name.split("-", 1)[1]) for p in marker_dir.glob("child-*")]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def kill_leftovers(marker_dir: Path) -> list[int]:
    """SIGKILL every recorded worker process group and child still alive; return their pids."""
    leftovers = []
    for pid in worker_pids(marker_dir) + child_pids(marker_dir):
        if not alive(pid):
            # Gone: its pid (and group id) may already belong to another process: pid_max is
            # 32768 here and several test runs share the machine, so a blind SIGKILL can hit
            # another test's launcher or rank monitor (seen: monitors gone, ranks refused).
            continue
        leftovers.append(pid)
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
    return leftovers


def markers(marker_dir: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in marker_dir.glob(f"{prefix}-*"))


def wait_for_markers(marker_dir: Path, prefix: str, count: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = markers(marker_dir, prefix)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(
        f"expected {count} {prefix!r} markers within {timeout} s, got {markers(marker_dir, prefix)}"
    )
