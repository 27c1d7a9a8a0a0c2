"""Node health checks run before every (re)join of the rendezvous.

Three kinds: a shell-free command (healthy when it exits 0), a Python callable named
``module:attribute`` (healthy when it returns True / ``(True, detail)``, unhealthy when it returns
False or raises), and a built-in GPU check through NVML (``nvidia-ml-py``: uncorrectable ECC
errors, critical XIDs, retired pages, row remapping) that reports itself *skipped* when the
binding or the driver is missing.
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


#: XIDs after which a GPU (its memory, its row remapper, its NVLink or its bus link) cannot be
#: trusted until it is reset: double-bit ECC (48), row-remap failure (63, 64), NVLink (74), fell
#: off the bus (79), high single-bit ECC rate (92), contained / uncontained ECC (94, 95), GSP
#: errors (119, 120). Other XIDs (13, 31, 43: a fault of the application, not of the GPU) are
#: logged and leave the node healthy, since a job bug must not take every node out of the job.
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})

# Events drained from one GPU's set per run; bounds a run during an XID storm.
_MAX_EVENTS_PER_RUN = 64


class NvmlGpuHealthCheck:
    """Check every visible NVIDIA GPU through NVML; skipped cleanly without NVML or a driver.

    A GPU is unhealthy when NVML cannot open it, when it has uncorrectable ECC errors since the
    driver loaded (the volatile counter), pending retired pages or a failed row remapping, or
    when it raised a critical XID (``critical_xids``). Queries a GPU does not support are
    ignored.

    NVML delivers an XID only to event sets registered when it happens, so the first run
    registers one event set per GPU and keeps it (and an NVML reference) open; every run then
    drains what arrived since. A critical XID is remembered: the GPU stays unhealthy for the
    life of this check (the launcher's), because it needs a reset before it can be trusted.

    Args:
        critical_xids: the XIDs that make a GPU unhealthy.
        xid_wait_ms: how long each run waits for a further XID event on each GPU.
    """

    name = "gpu (nvml)"

    def __init__(self, critical_xids: frozenset[int] = CRITICAL_XIDS, xid_wait_ms: int = 0) -> None:
        self.critical_xids = frozenset(critical_xids)
        self.xid_wait_ms = int(xid_wait_ms)
        # The launcher runs a check from its health-watch thread and before a rejoin.
        self._xid_lock = threading.Lock()
        self._nvml: Any = None
        self._event_sets: dict[int, Any] = {}
        self._xids: dict[int, set[int]] = {}

    def __call__(self) -> HealthResult:
        """Run the check once."""
        start = time.monotonic()
        try:
            import pynvml  # type: ignore[import-not-found, import-untyped, unused-ignore]  # noqa: PLC0415
        except ImportError:
            return HealthResult(
                self.name,
                True,
                "skipped: nvidia-ml-py is not installed (the 'gpu' extra: pip install "
                "nvidia-ml-py)",
                skipped=True,
            )
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return HealthResult(self.name, True, f"skipped: no NVIDIA driver ({exc})", skipped=True)
        try:
            problems, count = self._inspect(pynvml)
            problems.extend(self._xid_problems(pynvml, count))
        except pynvml.NVMLError as exc:
            # The driver answered nvmlInit but not a node-wide query: not a node to train on.
            problems, count = [f"NVML query failed ({exc})"], 0
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                logger.warning("nvmlShutdown failed: %s", exc)
        seconds = time.monotonic() - start
        if problems:
            return HealthResult(self.name, False, "; ".join(problems), seconds=seconds)
        return HealthResult(self.name, True, f"{count} GPU(s) healthy", seconds=seconds)

    def close(self) -> None:
        """Free the XID event sets and release this check's NVML reference."""
        with self._xid_lock:
            nvml, self._nvml = self._nvml, None
            if nvml is None:
                return
            for event_set in self._event_sets.values():
                try:
                    nvml.nvmlEventSetFree(event_set)
                except nvml.NVMLError as exc:
                    logger.debug("nvmlEventSetFree failed: %s", exc)
            self._event_sets.clear()
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                logger.debug("nvmlShutdown failed: %s", exc)

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
                ecc = int(
                    pynvml.nvmlDeviceGetTotalEccErrors(
                        handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                    )
                )
                if ecc > 0:
                    problems.append(
                        f"GPU {index}: {ecc} uncorrectable ECC error(s) since the driver loaded"
                    )
            except pynvml.NVMLError as exc:
                logger.debug("GPU %d: ECC query not supported: %s", index, exc)
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

    def _xid_problems(self, pynvml: Any, count: int) -> list[str]:
        """Drain the XID events of every GPU; one problem per GPU with a critical XID so far."""
        with self._xid_lock:
            if self._nvml is None:
                self._watch_xids(pynvml, count)
            for index, event_set in self._event_sets.items():
                for _ in range(_MAX_EVENTS_PER_RUN):
                    try:
                        event = pynvml.nvmlEventSetWait(event_set, self.xid_wait_ms)
                    except pynvml.NVMLError:  # a timeout: no event pending
                        break
                    xid = int(event.eventData)
                    if xid in self.critical_xids:
                        logger.error("GPU %d raised critical XID %d", index, xid)
                        self._xids.setdefault(index, set()).add(xid)
                    else:
                        logger.warning(
                            "GPU %d raised XID %d (not a critical XID; the node stays healthy)",
                            index,
                            xid,
                        )
            return [
                f"GPU {index}: critical XID {', '.join(str(x) for x in sorted(xids))} "
                "(reset the GPU)"
                for index, xids in sorted(self._xids.items())
            ]

    def _watch_xids(self, pynvml: Any, count: int) -> None:
        """Register one event set per GPU, holding an NVML reference for as long as they live."""
        pynvml.nvmlInit()
        self._nvml = pynvml
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                event_set = pynvml.nvmlEventSetCreate()
            except pynvml.NVMLError as exc:
                logger.debug("GPU %d: no XID event set: %s", index, exc)
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, event_set
                )
            except pynvml.NVMLError as exc:
                logger.debug("GPU %d: XID events not supported: %s", index, exc)
                pynvml.nvmlEventSetFree(event_set)
                continue
            self._event_sets[index] = event_set


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
