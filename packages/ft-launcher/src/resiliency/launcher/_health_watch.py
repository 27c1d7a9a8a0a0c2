"""Node health checks while the workers run, off the supervision loop.

Each check runs in its own thread, every ``interval_s`` seconds, within its own deadline (a
check's ``timeout`` attribute plus a margin, or ``default_deadline_s``). A check that overruns
its deadline counts as failed, and it is not started again until that run returns. The loop
only reads the latest results (`failures`), so a slow check (a command that takes 60 s) never
delays the detection of a hang or a crash. A result is logged when it changes, not every time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from resiliency.launcher.health import HealthCheck, HealthResult

__all__ = ["HealthWatch"]

logger = logging.getLogger(__name__)

_MARGIN_S = 5.0


class _Watched:
    """One check, its thread and its latest result."""

    def __init__(self, check: HealthCheck, deadline_s: float) -> None:
        self.check = check
        self.deadline_s = deadline_s
        self.latest: HealthResult | None = None
        self.running: threading.Thread | None = None
        self.started = 0.0
        self.outcome: HealthResult | None = None

    @property
    def name(self) -> str:
        return str(getattr(self.check, "name", type(self.check).__name__))

    def run_once(self) -> None:
        try:
            self.outcome = self.check()
        except Exception as exc:  # a check that raises is a failed check, never a dead thread
            self.outcome = HealthResult(self.name, False, f"raised {exc!r}")


class HealthWatch:
    """Runs node health checks periodically in background threads.

    Args:
        checks: the checks.
        interval_s: seconds between the end of one run of a check and the start of the next.
        default_deadline_s: deadline of a check without a ``timeout`` attribute.
    """

    def __init__(
        self, checks: Sequence[HealthCheck], interval_s: float, default_deadline_s: float = 60.0
    ) -> None:
        self._watched = [
            _Watched(c, float(getattr(c, "timeout", default_deadline_s)) + _MARGIN_S)
            for c in checks
        ]
        self._interval = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start one thread per check; the first runs begin after one interval."""
        for watched in self._watched:
            thread = threading.Thread(
                target=self._loop, args=(watched,), name=f"health-{watched.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads; a check still running is cancelled if it can be (a command is
        killed), otherwise left to finish on its own."""
        self._stop.set()
        for watched in self._watched:
            cancel = getattr(watched.check, "cancel", None)
            if callable(cancel) and watched.running is not None and watched.running.is_alive():
                cancel()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        self._threads.clear()

    def failures(self) -> list[HealthResult]:
        """The latest result of every check that failed its latest run (or overran)."""
        with self._lock:
            return [
                w.latest for w in self._watched if w.latest is not None and not w.latest.healthy
            ]

    def _loop(self, watched: _Watched) -> None:
        while not self._stop.wait(self._interval):
            result = self._run_bounded(watched)
            if result is not None:
                self._record(watched, result)

    def _run_bounded(self, watched: _Watched) -> HealthResult | None:
        """Run the check within its deadline; None while an overrunning run still goes on."""
        if watched.running is not None and watched.running.is_alive():
            return None  # already reported as overrunning; not started twice
        watched.outcome = None
        watched.started = time.monotonic()
        worker = threading.Thread(
            target=watched.run_once, name=f"health-run-{watched.name}", daemon=True
        )
        watched.running = worker
        worker.start()
        worker.join(watched.deadline_s)
        if worker.is_alive():
            return HealthResult(
                watched.name,
                False,
                f"did not finish within its {watched.deadline_s:.0f} s deadline",
                seconds=time.monotonic() - watched.started,
            )
        return watched.outcome

    def _record(self, watched: _Watched, result: HealthResult) -> None:
        with self._lock:
            previous, watched.latest = watched.latest, result
        if previous is not None and previous.healthy == result.healthy:
            return  # unchanged: nothing to say
        if result.healthy:
            if previous is not None:
                logger.warning("node health check %s passes again: %s", result.name, result.detail)
        else:
            logger.error("node health check %s FAILED: %s", result.name, result.detail)
