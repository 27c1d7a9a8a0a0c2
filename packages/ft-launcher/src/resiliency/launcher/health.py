"""Node health checks run before every (re)join of the rendezvous.

Three kinds: a shell-free command (healthy when it exits 0), a Python callable named
``module:attribute`` (healthy when it returns True / ``(True, detail)``, unhealthy when it returns
False or raises), and a built-in GPU check through NVML (``nvidia-ml-py``) that reports itself
*skipped* when the binding or the driver is missing.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from resiliency.launcher.errors import HealthCheckError

__all__ = [
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


class NvmlGpuHealthCheck:
    """Check every visible NVIDIA GPU through NVML; skipped cleanly without NVML or a driver.

    A GPU is unhealthy when NVML cannot open it, when it has pending retired pages, or when a row
    remapping failed. Queries a GPU does not support are ignored.
    """

    name = "gpu (nvml)"

    def __call__(self) -> HealthResult:
        """Run the check once."""
        start = time.monotonic()
        try:
            import pynvml  # type: ignore[import-not-found, import-untyped, unused-ignore]  # noqa: PLC0415
        except ImportError:
            return HealthResult(
                self.name,
                True,
                "skipped: nvidia-ml-py is not installed "
                "(pip install 'resiliency-ft-launcher[gpu]')",
                skipped=True,
            )
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return HealthResult(self.name, True, f"skipped: no NVIDIA driver ({exc})", skipped=True)
        try:
            problems, count = self._inspect(pynvml)
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                logger.warning("nvmlShutdown failed: %s", exc)
        seconds = time.monotonic() - start
        if problems:
            return HealthResult(self.name, False, "; ".join(problems), seconds=seconds)
        return HealthResult(self.name, True, f"{count} GPU(s) healthy", seconds=seconds)

    @staticmethod
    def _inspect(pynvml: Any) -> tuple[list[str], int]:
        problems: list[str] = []
        count = int(pynvml.nvmlDeviceGetCount())
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                problems.append(f"GPU {index}: not accessible ({exc})")
                continue
            try:
                if pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                    problems.append(f"GPU {index}: retired pages pending (reset the GPU)")
            except pynvml.NVMLError as exc:
                logger.debug("GPU %d: retired-pages query not supported: %s", index, exc)
            try:
                remap = pynvml.nvmlDeviceGetRemappedRows(handle)
                if len(remap) >= 4 and remap[3]:
                    problems.append(f"GPU {index}: row remapping failed")
            except pynvml.NVMLError as exc:
                logger.debug("GPU %d: remapped-rows query not supported: %s", index, exc)
        return problems, count


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
