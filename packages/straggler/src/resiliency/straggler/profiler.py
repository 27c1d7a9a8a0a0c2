"""The kernel-profiler plug-in interface: how a GPU timing back end feeds the Detector.

A plug-in is published in the entry-point group ``resiliency.straggler.kernel_profilers``. The
entry point names a zero-argument callable (usually a class) with an integer ``API_VERSION``
attribute; calling it returns an object satisfying :class:`KernelProfiler`. The straggler package
never imports a plug-in by name and skips, with one warning, a plug-in whose ``API_VERSION`` it
does not support.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from resiliency.straggler.statistic import StatisticsMapping

__all__ = ["API_VERSION", "ENTRY_POINT_GROUP", "KernelProfiler", "KernelStats"]

API_VERSION = 1
"""The kernel-profiler interface version this straggler release implements."""

ENTRY_POINT_GROUP = "resiliency.straggler.kernel_profilers"


@dataclass(frozen=True)
class KernelStats(StatisticsMapping):
    """Statistics of one kernel's GPU durations over the samples since the last read.

    Also a read-only mapping ``{Statistic: milliseconds}`` (``Statistic.NUM``: the count), as
    NVIDIA's resiliency extension reports kernel statistics.

    Attributes:
        count: Number of completed launches observed.
        min_us: Shortest duration, in microseconds.
        max_us: Longest duration, in microseconds.
        median_us: Median duration, in microseconds.
        mean_us: Mean duration, in microseconds.
        std_us: Sample standard deviation, in microseconds (NaN when unknown).
    """

    count: int
    min_us: float
    max_us: float
    median_us: float
    mean_us: float
    std_us: float = math.nan


@runtime_checkable
class KernelProfiler(Protocol):
    """What a kernel-profiler plug-in provides (interface version :data:`API_VERSION`).

    Collection is active while the number of ``start()`` calls exceeds the number of ``stop()``
    calls (start/stop nest). Kernels that begin while collection is active are timed.
    """

    API_VERSION: int

    def start(self) -> None:
        """Begin (or nest) kernel collection. Raises a clear error where no GPU can be profiled."""
        ...

    def stop(self) -> None:
        """End one level of collection started by :meth:`start`."""
        ...

    def read_and_reset(self) -> dict[str, KernelStats]:
        """Flush pending records and return per-kernel statistics since the previous read."""
        ...

    def dropped_records(self) -> int:
        """Total activity records lost so far (buffer pool exhausted); never silently zero."""
        ...

    def shutdown(self) -> None:
        """Stop collecting and release the back end's resources; safe to call twice."""
        ...
