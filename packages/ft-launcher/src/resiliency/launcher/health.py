"""Node health checks run before every (re)join of the rendezvous.

Three kinds: a shell-free command (healthy when it exits 0), a Python callable named
``module:attribute`` (healthy when it returns True / ``(True, detail)``, unhealthy when it returns
False or raises), and a built-in GPU check through NVML (``nvidia-ml-py``, read by ft-core's
GPU probe: uncorrectable ECC errors, critical XIDs, retired pages, row remapping) that reports
itself *skipped* when the binding or the driver is missing.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from resiliency.ft import CRITICAL_XIDS, GpuHealth, GpuProbe
from resiliency.launcher.errors import HealthCheckError

__all__ = [
    "CRITICAL_XIDS",
    "CallableHealthCheck",
    "CommandHealthCheck",
    "HealthCheck",
    "HealthResult",
    "NvmlGpuHealthCheck",
    "run_health_checks",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HealthResult:
    """The result of one check.

    Attributes:
        name: the check's name (for logs).
        healthy: False only when the check found a problem.
        detail: what was checked or what is wrong.
        skipped: the check could not run here (no GPU, no NVML) and counts as healthy.
        seconds: how long the check took.
    """

    name: str
    healthy: bool
    detail: str
    skipped: bool = False
    seconds: float = 0.0


class HealthCheck(Protocol):
    """A node health check: a name and a call that returns a :class:`HealthResult`."""

    name: str

    def __call__(self) -> HealthResult:
        """Run the check once."""
        ...


class CommandHealthCheck:
    """Run a command (split like a shell would, but run without one); exit 0 means healthy.

    Args:
        command: the command line, e.g. ``"/opt/bin/node_ok --quick"``.
        timeout: seconds before the command is killed and the node declared unhealthy.

    Raises:
        HealthCheckError: the command line is empty.
    """

    def __init__(self, command: str, timeout: float = 60.0) -> None:
        self.argv = shlex.split(command)
        if not self.argv:
            raise HealthCheckError("--node-health-check-cmd is empty; give a command to run")
        self.timeout = timeout
        self.name = f"command {command!r}"
        # Runs of this check that are under way: the loop's, and the one before a rejoin.
        self._running: set[subprocess.Popen[str]] = set()

    def cancel(self) -> None:
        """Kill the process group of every run under way (the launcher is stopping)."""
        for proc in list(self._running):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)

    def __call__(self) -> HealthResult:
        """Run the command once (in its own session, so `cancel` ends it with its children)."""
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        except FileNotFoundError:
            return HealthResult(self.name, False, f"command not found: {self.argv[0]}")
        self._running.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return HealthResult(self.name, False, f"did not finish within {self.timeout:g} s")
        finally:
            self._running.discard(proc)
        seconds = time.monotonic() - start
        output = (stdout + stderr).strip()[-500:]
        if proc.returncode == 0:
            return HealthResult(self.name, True, output or "exit 0", seconds=seconds)
        return HealthResult(
            self.name, False, f"exit {proc.returncode}: {output or '(no output)'}", seconds=seconds
        )


def _load_callable(spec: str) -> Callable[[], Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HealthCheckError(
            f"--node-health-check-fn {spec!r} is not of the form 'package.module:function'"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise HealthCheckError(
            f"--node-health-check-fn {spec!r}: cannot import {module_name!r} ({exc})"
        ) from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            raise HealthCheckError(
                f"--node-health-check-fn {spec!r}: {module_name!r} has no attribute {attr!r}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise HealthCheckError(f"--node-health-check-fn {spec!r} is not callable")
    return target


class CallableHealthCheck:
    """Call a Python function; True or ``(True, detail)`` means healthy.

    Args:
        spec: ``"package.module:function"`` (imported once, now), or the callable itself.

    Raises:
        HealthCheckError: the module or attribute cannot be found, or it is not callable.
    """

    def __init__(self, spec: str | Callable[[], Any]) -> None:
        if callable(spec):
            self.fn = spec
            self.name = f"callable {getattr(spec, '__qualname__', repr(spec))}"
        else:
            self.fn = _load_callable(spec)
            self.name = f"callable {spec}"

    def __call__(self) -> HealthResult:
        """Call the function once."""
        start = time.monotonic()
        try:
            outcome = self.fn()
        except Exception as exc:  # a user check that raises means "unhealthy", never a crash
            logger.exception("node health check %s raised", self.name)
            return HealthResult(self.name, False, f"raised {type(exc).__name__}: {exc}")
        seconds = time.monotonic() - start
        if isinstance(outcome, tuple) and len(outcome) == 2:
            healthy, detail = bool(outcome[0]), str(outcome[1])
        else:
            healthy, detail = bool(outcome), f"returned {outcome!r}"
        return HealthResult(self.name, healthy, detail, seconds=seconds)


# Events drained from one GPU per run; bounds a run during an XID storm.
_MAX_EVENTS_PER_RUN = 64


class NvmlGpuHealthCheck:
    """Check every visible NVIDIA GPU through NVML; skipped cleanly without NVML or a driver.

    A GPU is unhealthy when NVML cannot open it, when it has uncorrectable ECC errors since the
    driver loaded (the volatile counter), pending retired pages or a failed row remapping, or
    when it raised a critical XID (``critical_xids``). Queries a GPU does not support are
    ignored. NVML is read through ft-core's :class:`~resiliency.ft.GpuProbe`, opened at the
    first run and kept open until :meth:`close`, so that every run sees the XIDs raised since
    the one before. A critical XID is remembered: the GPU stays unhealthy for the life of this
    check (the launcher's), because it needs a reset before it can be trusted.

    Args:
        critical_xids: the XIDs that make a GPU unhealthy.
        xid_wait_ms: how long each run waits for a further XID event on each GPU.
    """

    name = "gpu (nvml)"

    def __init__(self, critical_xids: frozenset[int] = CRITICAL_XIDS, xid_wait_ms: int = 0) -> None:
        self.critical_xids = frozenset(critical_xids)
        self.xid_wait_ms = int(xid_wait_ms)
        self._probe = GpuProbe()
        # The launcher runs a check from its health-watch thread and before a rejoin.
        self._xid_lock = threading.Lock()
        self._xids: dict[int, set[int]] = {}

    def __call__(self) -> HealthResult:
        """Run the check once."""
        start = time.monotonic()
        probe = self._probe
        if not probe.open():
            if probe.state == "failed":
                # The driver answered nvmlInit but not a node-wide query: not a node to train on.
                return HealthResult(self.name, False, probe.note or "NVML query failed")
            return HealthResult(self.name, True, f"skipped: {probe.note}", skipped=True)
        problems = [
            problem
            for problem in (_problem(probe.health(index)) for index in range(probe.count))
            if problem
        ]
        problems.extend(self._xid_problems())
        seconds = time.monotonic() - start
        if problems:
            return HealthResult(self.name, False, "; ".join(problems), seconds=seconds)
        return HealthResult(self.name, True, f"{probe.count} GPU(s) healthy", seconds=seconds)

    def close(self) -> None:
        """Release NVML (the XID event sets and the probe's reference)."""
        self._probe.close()

    def _xid_problems(self) -> list[str]:
        """Take the new XID events; one problem per GPU with a critical XID so far."""
        with self._xid_lock:
            for event in self._probe.drain_xids(self.xid_wait_ms, _MAX_EVENTS_PER_RUN):
                if event.xid in self.critical_xids:
                    logger.error("GPU %d raised critical XID %d", event.index, event.xid)
                    self._xids.setdefault(event.index, set()).add(event.xid)
                else:
                    logger.warning(
                        "GPU %d raised XID %d (not a critical XID; the node stays healthy)",
                        event.index,
                        event.xid,
                    )
            return [
                f"GPU {index}: critical XID {', '.join(str(x) for x in sorted(xids))} "
                "(reset the GPU)"
                for index, xids in sorted(self._xids.items())
            ]


def _problem(health: GpuHealth) -> str | None:
    """What is wrong with one GPU, in one clause (None when nothing is)."""
    where = f"GPU {health.index}"
    if health.error is not None:
        return f"{where}: {health.error}"
    found = []
    if health.ecc_uncorrectable > 0:
        found.append(
            f"{health.ecc_uncorrectable} uncorrectable ECC error(s) since the driver loaded"
        )
    if health.retired_pages_pending:
        found.append("retired pages pending (reset the GPU)")
    if health.row_remap_failed:
        found.append("row remapping failed")
    return "; ".join(f"{where}: {f}" for f in found) or None


def run_health_checks(checks: Sequence[HealthCheck]) -> list[HealthResult]:
    """Run every check (all of them, even after a failure, so the log names every problem).

    Args:
        checks: the checks to run, in order.

    Returns:
        One result per check.
    """
    results = []
    for check in checks:
        result = check()
        if result.skipped:
            logger.info("node health check %s: %s", result.name, result.detail)
        elif result.healthy:
            logger.info(
                "node health check %s passed in %.2f s: %s",
                result.name,
                result.seconds,
                result.detail,
            )
        else:
            logger.error("node health check %s FAILED: %s", result.name, result.detail)
        results.append(result)
    return results
