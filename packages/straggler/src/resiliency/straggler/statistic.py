"""``Statistic``: the keys of a timing summary, as NVIDIA's resiliency extension names them.

:class:`~resiliency.straggler.SectionSummary` and :class:`~resiliency.straggler.KernelStats` are
read-only mappings from :class:`Statistic` to a value in **milliseconds** (``NUM`` is a count),
so ``report.local_section_summaries["step"][Statistic.MED]`` reads as it does in that tool. Their
``*_us`` attributes give the same numbers in microseconds.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping

__all__ = ["Statistic", "StatisticsMapping"]


class Statistic(enum.Enum):
    """A statistic of a set of durations.

    Attributes:
        MIN: Shortest duration (ms).
        MAX: Longest duration (ms).
        MED: Median duration (ms).
        AVG: Mean duration (ms).
        STD: Sample standard deviation (ms); NaN with fewer than two samples.
        NUM: Number of samples.
    """

    MIN = enum.auto()
    MAX = enum.auto()
    MED = enum.auto()
    AVG = enum.auto()
    STD = enum.auto()
    NUM = enum.auto()

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


_US_FIELD = {
    Statistic.MIN: "min_us",
    Statistic.MAX: "max_us",
    Statistic.MED: "median_us",
    Statistic.AVG: "mean_us",
    Statistic.STD: "std_us",
}


class StatisticsMapping(Mapping[Statistic, float]):
    """Mixin: a summary with ``count`` and ``*_us`` fields, read as ``{Statistic: ms}``."""

    __slots__ = ()
    count: int

    def __getitem__(self, key: Statistic) -> float:
        if key is Statistic.NUM:
            return self.count
        name = _US_FIELD.get(key) if isinstance(key, Statistic) else None
        if name is None:
            raise KeyError(key)
        value: float = getattr(self, name, math.nan)
        return value / 1e3

    def __iter__(self) -> Iterator[Statistic]:
        return iter(Statistic)

    def __len__(self) -> int:
        return len(Statistic)
