"""Rate-limited logging of an error that repeats: the first in full, then a count a minute."""

from __future__ import annotations

import logging
import time

_SUMMARY_EVERY_S = 60.0


class RepeatedErrorLog:
    """Logs the first occurrence of an error with its traceback, later ones as periodic counts.

    Args:
        logger: where to log.
        what: what failed, e.g. "unexpected error in the monitor loop".
    """

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._logger = logger
        self._what = what
        self.total = 0
        self._unreported = 0
        self._last: BaseException | None = None
        self._next_summary = 0.0

    def report(self, exc: BaseException, now: float | None = None) -> None:
        """Record one occurrence of ``exc`` (call from its ``except`` block)."""
        now = time.monotonic() if now is None else now
        self.total += 1
        if self.total == 1:
            self._logger.error(
                "%s; continuing (repeats are counted, one line a minute)",
                self._what,
                exc_info=exc,
            )
            self._next_summary = now + _SUMMARY_EVERY_S
            return
        self._unreported += 1
        self._last = exc
        if now >= self._next_summary:
            self._logger.error(
                "%s: %d more in the last minute (%d in total), the latest: %r",
                self._what,
                self._unreported,
                self.total,
                self._last,
            )
            self._unreported = 0
            self._next_summary = now + _SUMMARY_EVERY_S
