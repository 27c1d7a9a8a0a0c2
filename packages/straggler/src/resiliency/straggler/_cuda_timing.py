"""GPU timing of whole sections with CUDA events, the fallback when no plug-in is installed.

Each timed entry records a start and an end event on the current stream; the pairs are resolved
(``elapsed_time``) at report time, or earlier, without blocking, when the pending queue is full.
Durations are reported per section, under the section's name, in the same form as per-kernel
statistics, so the GPU score formulas apply unchanged.
"""

from __future__ import annotations

import logging
import statistics
import sys
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from resiliency.straggler.profiler import KernelStats

__all__ = ["CudaEventTimer"]

log = logging.getLogger(__name__)


class _Event(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end: Any) -> float: ...


class CudaEventTimer:
    """Times sections on the GPU with pairs of CUDA events, in bounded memory.

    Args:
        event_factory: Returns a new timing-enabled event.
        max_pending: Event pairs awaiting resolution before completed ones are resolved early;
            when none has completed, the oldest pair is dropped and counted.
        samples_per_section: Durations kept per section between two reads.
    """

    description = "CUDA events (whole-section GPU time; no kernel-profiler plug-in installed)"

    def __init__(
        self,
        event_factory: Callable[[], _Event],
        max_pending: int = 4096,
        samples_per_section: int = 1024,
    ) -> None:
        self._new_event = event_factory
        self._max_pending = max_pending
        self._samples = samples_per_section
        self._open: dict[str, list[_Event]] = {}
        self._pending: deque[tuple[str, _Event, _Event]] = deque()
        self._durations: dict[str, deque[float]] = {}
        self._counts: dict[str, int] = {}
        self._dropped = 0

    @classmethod
    def create(cls) -> CudaEventTimer | None:
        """A timer on the current CUDA device, or ``None`` without an imported torch with a GPU."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        try:
            available = bool(torch.cuda.is_available())
        except Exception as exc:
            log.warning("torch.cuda.is_available() failed (%s); no CUDA-event timing", exc)
            return None
        if not available:
            return None
        return cls(lambda: torch.cuda.Event(enable_timing=True))

    def enter(self, section: str) -> None:
        """Record the start event of one timed entry."""
        event = self._new_event()
        event.record()
        self._open.setdefault(section, []).append(event)

    def exit(self, section: str) -> None:
        """Record the end event and queue the pair."""
        end = self._new_event()
        end.record()
        start = self._open[section].pop()
        self._pending.append((section, start, end))
        if len(self._pending) >= self._max_pending:
            self._resolve(block=False)
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
                self._dropped += 1

    def _resolve(self, *, block: bool) -> None:
        while self._pending:
            section, start, end = self._pending[0]
            if block:
                end.synchronize()
            elif not end.query():
                return
            self._pending.popleft()
            ring = self._durations.get(section)
            if ring is None:
                ring = self._durations[section] = deque(maxlen=self._samples)
            ring.append(start.elapsed_time(end) * 1e3)  # ms -> us
            self._counts[section] = self._counts.get(section, 0) + 1

    def read(self) -> dict[str, KernelStats]:
        """Wait for queued pairs and return per-section GPU statistics since the previous read."""
        self._resolve(block=True)
        out: dict[str, KernelStats] = {}
        for section, ring in self._durations.items():
            if ring:
                values = list(ring)
                out[section] = KernelStats(
                    count=self._counts.get(section, len(values)),
                    min_us=min(values),
                    max_us=max(values),
                    median_us=statistics.median(values),
                    mean_us=sum(values) / len(values),
                )
                ring.clear()
        self._counts.clear()
        return out

    def dropped(self) -> int:
        """Event pairs dropped because the queue was full and none had completed."""
        return self._dropped

    def shutdown(self) -> None:
        """Forget queued events."""
        self._pending.clear()
        self._open.clear()
        self._durations.clear()
