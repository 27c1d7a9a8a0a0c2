"""Validated Detector settings and the per-initialization state the Detector keeps."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

from resiliency.straggler._exchange import TorchExchange
from resiliency.straggler._schedule import ReportSchedule
from resiliency.straggler._scoring import BestHistory
from resiliency.straggler.errors import StragglerConfigError
from resiliency.straggler.report import Thresholds
from resiliency.straggler.sections import SectionTimings
from resiliency.straggler.wrapping import CallableWrapper

__all__ = [
    "INDIVIDUAL",
    "NOT_SELECTED",
    "RELATIVE",
    "DetectorState",
    "check_profiling_interval",
    "check_report_interval",
    "check_scores",
]

RELATIVE = "relative_perf_scores"
INDIVIDUAL = "individual_perf_scores"
_VALID_SCORES = (RELATIVE, INDIVIDUAL)
NOT_SELECTED: Any = object()


def check_scores(scores_to_compute: str | Sequence[str]) -> frozenset[str]:
    if scores_to_compute == "all":
        return frozenset(_VALID_SCORES)
    if isinstance(scores_to_compute, str):
        scores_to_compute = [scores_to_compute]
    chosen = frozenset(scores_to_compute)
    unknown = sorted(chosen - set(_VALID_SCORES))
    if unknown or not chosen:
        raise StragglerConfigError(
            f"scores_to_compute must be 'all' or a non-empty list of {list(_VALID_SCORES)}, "
            f"got {scores_to_compute!r}"
        )
    return chosen


def check_profiling_interval(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StragglerConfigError(
            f"profiling_interval must be an integer >= 1 (time every N-th entry), got {value!r}"
        )
    return value


def check_report_interval(value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise StragglerConfigError(
            f"report_time_interval must be a positive number of seconds, got {value!r}"
        )
    return float(value)


@dataclass
class DetectorState:
    """Everything one ``Detector.initialize()`` set up; dropped by ``shutdown()``."""

    scores: frozenset[str]
    gather_on_rank0: bool
    profiling_interval: int
    samples_per_section: int
    node: str
    rank: int
    exchange: TorchExchange | None
    schedule: ReportSchedule
    thresholds: Thresholds
    wrapper: CallableWrapper
    timings: dict[str, SectionTimings] = field(default_factory=dict)
    best: BestHistory = field(default_factory=BestHistory)
    gpu: Any = NOT_SELECTED
    gpu_dropped: int = 0
    last_call_reported: bool = False
    clock: Callable[[], int] = perf_counter_ns

    @property
    def relative(self) -> bool:
        return RELATIVE in self.scores

    @property
    def individual(self) -> bool:
        return INDIVIDUAL in self.scores

    @property
    def collective(self) -> TorchExchange | None:
        """The exchange when reports need one (never for individual scores kept locally)."""
        if self.exchange is not None and (self.relative or self.gather_on_rank0):
            return self.exchange
        return None
