"""Rate-limited logging of dropped frames: a flood of garbage must not flood the log."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_VERBATIM = 5
_SUMMARY_EVERY_S = 10.0
_SHOWN_BYTES = 120


class BadFrameLog:
    """Log the first few dropped frames in full (truncated), then only periodic counts."""

    def __init__(self) -> None:
        self.total = 0
        self._unreported = 0
        self._next_summary = 0.0

    def report(self, now: float, pid: int, reason: str, data: bytes | None) -> None:
        """Record one dropped frame.

        Args:
            now: The current ``time.monotonic()``.
            pid: The sender's pid.
            reason: Why it was dropped.
            data: The frame, or None when it was not kept (oversized).
        """
        self.total += 1
        if self.total <= _VERBATIM:
            shown = "" if data is None else f": {data[:_SHOWN_BYTES]!r}"
            more = "..." if data is not None and len(data) > _SHOWN_BYTES else ""
            logger.warning("dropped a frame from pid %d (%s)%s%s", pid, reason, shown, more)
            if self.total == _VERBATIM:
                logger.warning("further dropped frames are counted, not shown")
                self._next_summary = now + _SUMMARY_EVERY_S
            return
        self._unreported += 1
        self.maybe_summarize(now)

    def maybe_summarize(self, now: float) -> None:
        """Log the count of frames dropped since the last summary, at most every 10 s."""
        if self._unreported and now >= self._next_summary:
            logger.warning(
                "dropped %d more malformed frames (%d in total)", self._unreported, self.total
            )
            self._unreported = 0
            self._next_summary = now + _SUMMARY_EVERY_S
