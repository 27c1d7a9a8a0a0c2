"""When to report: every rank must reach the same decision in the same iteration.

A mismatch would hang the next collective, so with more than one rank only the group root looks at
the clock, and its decision travels by broadcast. Broadcasting on every call would cost a collective
(and, with NCCL, a device synchronization) per iteration, so the root instead announces how many
calls to skip before the next check: half the remaining time at the recent call rate, at least one.
Checks thus become denser as the deadline nears and the report lands in the first call at or after
it, while an interval of N iterations costs about log2(N) broadcasts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from resiliency.straggler._exchange import Exchange

__all__ = ["ReportSchedule"]

MAX_CALLS_BETWEEN_CHECKS = 1000
_REPORT_NOW = 0


class ReportSchedule:
    """Decides, identically on every rank, whether the report interval has elapsed.

    Args:
        interval_s: Seconds between reports.
        clock: Monotonic clock in seconds (tests may pass their own).
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.interval_s = interval_s
        now = clock()
        self._last_report = now
        self._last_check = now
        self._calls_left = 1
        self._spacing = 1
        self.checks = 0
        """Number of collective checks performed (for tests and benchmarks)."""

    def mark_reported(self) -> None:
        """Start a new interval (called when a report is generated)."""
        now = self._clock()
        self._last_report = now
        self._last_check = now
        self._calls_left = 1
        self._spacing = 1

    def _root_decision(self) -> int:
        now = self._clock()
        remaining = self._last_report + self.interval_s - now
        if remaining <= 0:
            return _REPORT_NOW
        per_call = (now - self._last_check) / self._spacing
        self._last_check = now
        if per_call <= 0:
            return MAX_CALLS_BETWEEN_CHECKS
        return max(1, min(MAX_CALLS_BETWEEN_CHECKS, int(remaining / per_call / 2)))

    def elapsed(self, exchange: Exchange | None) -> bool:
        """Count one call and say whether to report now; collective when ``exchange`` is given.

        Args:
            exchange: The group's exchange, or ``None`` when no collective follows the decision
                (single rank, or individual scores without gathering): the local clock decides.

        Returns:
            True when the interval has elapsed (the same answer on every rank of the group).
        """
        if exchange is None:
            return self._clock() - self._last_report >= self.interval_s
        self._calls_left -= 1
        if self._calls_left > 0:
            return False
        decision = self._root_decision() if exchange.is_root else -1
        decision = exchange.broadcast_int(decision)
        self.checks += 1
        if decision == _REPORT_NOW:
            # Until a report resets the schedule, keep checking on every call.
            self._calls_left = 1
            self._spacing = 1
            return True
        self._calls_left = self._spacing = decision
        return False
