"""Collection of section timings on the hot path, in bounded memory.

Every named section owns one :class:`SectionTimings`: a preallocated ring of the most recent CPU
durations (nanoseconds). The context managers handed to users are created once per section name
and reused, so entering and leaving a section allocates nothing: one clock reading on each side
(``time.perf_counter_ns`` unless ``Detector.initialize(clock=...)`` gave another) and a store into
the ring.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter_ns
from types import TracebackType
from typing import Protocol

from resiliency.straggler.statistic import StatisticsMapping

__all__ = ["SectionSummary", "SectionTimings"]

_SKIPPED = -1  # marks an entry that profiling_interval chose not to time


@dataclass(frozen=True)
class SectionSummary(StatisticsMapping):
    """CPU (wall-clock) timing statistics of one section on this rank since the last report.

    Also a read-only mapping ``{Statistic: milliseconds}`` (``Statistic.NUM``: the count), which
    is what NVIDIA's resiliency extension puts in ``Report.local_section_summaries``.

    Attributes:
        count: Timed entries since the last report (including those no longer in the ring).
        min_us: Shortest retained duration, in microseconds.
        max_us: Longest retained duration, in microseconds.
        median_us: Median of the retained durations, in microseconds.
        mean_us: Mean of the retained durations, in microseconds.
        std_us: Sample standard deviation of the retained durations, in microseconds (NaN
            with fewer than two).
    """

    count: int
    min_us: float
    max_us: float
    median_us: float
    mean_us: float
    std_us: float = math.nan


class SectionTimings:
    """Bounded history of one section's CPU durations.

    The ring keeps the ``capacity`` most recent durations taken since the last :meth:`drain`; older
    ones are overwritten, so memory stays fixed however long the run is.

    Args:
        name: The section name.
        capacity: Ring size (durations kept between two reports).
        profiling_interval: Time every ``profiling_interval``-th entry only.
    """

    __slots__ = ("capacity", "count", "interval", "name", "ring", "tick")

    def __init__(self, name: str, capacity: int, profiling_interval: int) -> None:
        self.name = name
        self.capacity = capacity
        self.ring = [0] * capacity
        self.count = 0
        self.interval = profiling_interval
        self.tick = 0

    def record(self, duration_ns: int) -> None:
        """Store one duration (the hot path inlines this; tests and fallbacks use it)."""
        count = self.count
        self.ring[count % self.capacity] = duration_ns
        self.count = count + 1

    def take_sample(self) -> bool:
        """Count one entry; True when ``profiling_interval`` says to time it.

        The section context managers inline this (their enter is the hot path); timers off the
        hot path, such as the net-of-collective-wait section, call it.
        """
        tick = self.tick + 1
        if tick >= self.interval:
            self.tick = 0
            return True
        self.tick = tick
        return False

    def drain(self) -> tuple[int, list[int]]:
        """Return ``(entries_timed, retained_durations_ns)`` and start a new window."""
        count = self.count
        kept = self.ring[:count] if count < self.capacity else list(self.ring)
        self.count = 0
        return count, kept


def summarize(count: int, durations_ns: list[int]) -> SectionSummary | None:
    """Summarize one window of durations; ``None`` when the window holds no sample."""
    if not durations_ns:
        return None
    return SectionSummary(
        count=count,
        min_us=min(durations_ns) / 1e3,
        max_us=max(durations_ns) / 1e3,
        median_us=statistics.median(durations_ns) / 1e3,
        mean_us=sum(durations_ns) / len(durations_ns) / 1e3,
        std_us=statistics.stdev(durations_ns) / 1e3 if len(durations_ns) > 1 else math.nan,
    )


class GpuTimer(Protocol):
    """What a section needs from a GPU timing back end (a plug-in adapter or CUDA events)."""

    def enter(self, section: str) -> None:
        """A timed entry into ``section`` begins."""
        ...

    def exit(self, section: str) -> None:
        """The matching timed entry ends."""
        ...


class CpuSection:
    """The reusable context manager of one section, CPU timing only.

    Args:
        timings: Where durations go; shared by every context manager of the same name.
        clock: Monotonic clock in integer nanoseconds.
    """

    __slots__ = ("_clock", "_starts", "_timings")

    def __init__(self, timings: SectionTimings, clock: Callable[[], int] = perf_counter_ns) -> None:
        self._timings = timings
        self._clock = clock
        # A stack rather than one slot: the same section may be entered recursively.
        self._starts: list[int] = []

    @property
    def name(self) -> str:
        """The section name."""
        return self._timings.name

    @property
    def timings(self) -> SectionTimings:
        """Where this section's durations go (other timers of the same section share it)."""
        return self._timings

    def __enter__(self) -> None:
        t = self._timings
        tick = t.tick + 1
        if tick >= t.interval:
            t.tick = 0
            self._starts.append(self._clock())
        else:
            t.tick = tick
            self._starts.append(_SKIPPED)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = self._clock()
        start = self._starts.pop()
        if start != _SKIPPED:
            t = self._timings
            count = t.count
            t.ring[count % t.capacity] = end - start
            t.count = count + 1


class GpuSection(CpuSection):
    """A section that also times its GPU work through a :class:`GpuTimer` when sampled.

    Args:
        timings: Where CPU durations go.
        gpu: The GPU timing back end.
        clock: Monotonic clock in integer nanoseconds (for the CPU durations).
    """

    __slots__ = ("_gpu",)

    def __init__(
        self, timings: SectionTimings, gpu: GpuTimer, clock: Callable[[], int] = perf_counter_ns
    ) -> None:
        super().__init__(timings, clock)
        self._gpu = gpu

    def __enter__(self) -> None:
        t = self._timings
        tick = t.tick + 1
        if tick >= t.interval:
            t.tick = 0
            self._gpu.enter(t.name)
            self._starts.append(self._clock())
        else:
            t.tick = tick
            self._starts.append(_SKIPPED)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = self._clock()
        start = self._starts.pop()
        if start != _SKIPPED:
            t = self._timings
            count = t.count
            t.ring[count % t.capacity] = end - start
            t.count = count + 1
            self._gpu.exit(t.name)
