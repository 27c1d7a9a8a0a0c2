"""Goodput and the badput breakdown of a ledger, for the whole job, windows and attempts.

Categories (they sum to the total time, see docs/goodput.md):

* ``productive``: kept new steps x the ideal step time;
* ``startup``: from the first event to the first progress of the first cycle;
* ``loading``: checkpoint loads; ``saving``: the blocking part of checkpoint saves;
* ``lost_progress``: time spent on steps redone after a restart;
* ``restart``: from a failure to the first progress of the next cycle (loads excluded), with
  ``hang_detection`` (from the hang's start to its detection) as a sub-part of it;
* ``slowdown``: kept steps' time beyond the ideal step time;
* ``idle``: the rest (e.g. after the last step until the job's end).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from dataclasses import dataclass, field
from typing import Any

from resiliency.goodput._by_class import ClassRow, by_class
from resiliency.goodput._timeline import Timeline, build_timeline
from resiliency.goodput.errors import GoodputError
from resiliency.goodput.ledger import Ledger

CATEGORIES = (
    "productive",
    "startup",
    "loading",
    "saving",
    "lost_progress",
    "restart",
    "slowdown",
    "idle",
)
SUB_CATEGORIES = {"hang_detection": "restart"}
_BASE_TO_CATEGORY = {"startup": "startup", "restart": "restart", "lost": "lost_progress"}


@dataclass
class Breakdown:
    """Seconds per category over ``[start, end)``; ``hang_detection`` is part of ``restart``."""

    start: float
    end: float
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))
    hang_detection: float = 0.0

    @property
    def total(self) -> float:
        return self.end - self.start

    @property
    def goodput(self) -> float:
        """Productive share of the total (0..1); 0 for an empty span."""
        return self.seconds["productive"] / self.total if self.total > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "total_s": self.total,
            "goodput": self.goodput,
            "seconds": dict(self.seconds),
            "hang_detection_s": self.hang_detection,
        }


@dataclass
class AttemptRow:
    """One cycle (attempt): its number, how it ended, and its breakdown."""

    cycle: int
    cause: str | None
    timer: str | None
    restore_step: int | None
    last_step: int | None
    breakdown: Breakdown


@dataclass
class Report:
    """Everything ``resiliency-goodput report`` prints."""

    whole: Breakdown
    ideal_step_time_s: float | None
    ideal_source: str
    initial_step: int | None
    final_step: int | None
    attempts: list[AttemptRow]
    windows: list[Breakdown]
    warnings: list[str]
    events: int
    step_events: int
    files: list[str]
    google_figure: float | None = None
    google_steps: tuple[int | None, int | None] | None = None
    timeline: Timeline | None = None
    notes: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    by_class: list[ClassRow] = field(default_factory=list)

    @property
    def restarts(self) -> int:
        """Cycles after the first one."""
        return max(len(self.attempts) - 1, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.whole.to_json(),
            "ideal_step_time_s": self.ideal_step_time_s,
            "ideal_step_time_source": self.ideal_source,
            "initial_step": self.initial_step,
            "final_step": self.final_step,
            "attempts": [
                {
                    "cycle": a.cycle,
                    "cause": a.cause,
                    "timer": a.timer,
                    "restore_step": a.restore_step,
                    "last_step": a.last_step,
                    **a.breakdown.to_json(),
                }
                for a in self.attempts
            ],
            "windows": [w.to_json() for w in self.windows],
            "restarts": self.restarts,
            "google_goodput": self.google_figure,
            "google_min_loaded_step": self.google_steps[0] if self.google_steps else None,
            "google_max_saved_step": self.google_steps[1] if self.google_steps else None,
            "warnings": self.warnings,
            "notes": self.notes,
            "hints": self.hints,
            "by_class": [row.to_json() for row in self.by_class],
            "events": self.events,
            "step_events": self.step_events,
            "files": self.files,
        }


def _weighted_median(pairs: list[tuple[float, int]]) -> float:
    """Median of values given as ``(value, count)``, sorted by value."""
    total = sum(n for _, n in pairs)
    half = total / 2.0
    seen = 0
    for value, n in pairs:
        seen += n
        if seen >= half:
            return value
    return pairs[-1][0]


def _median(values: list[float], weights: list[int] | None) -> float:
    """(Weighted) lower median of sorted ``values``."""
    if weights is None:
        return values[max(math.ceil(len(values) / 2) - 1, 0)]
    return _weighted_median(list(zip(values, weights, strict=True)))


def _median_deviation(values: list[float], median: float) -> float:
    """Lower median of ``|v - median|`` over sorted ``values``, without building that list.

    The deviations are two sorted runs, ``median - v`` below the median (read backwards) and
    ``v - median`` from it on; their k-th smallest is found by bisection in O(log n).
    """
    split = bisect.bisect_left(values, median)
    a_len, b_len = split, len(values) - split

    def a(i: int) -> float:
        return median - values[split - 1 - i]

    def b(j: int) -> float:
        return values[split + j] - median

    take = max(math.ceil(len(values) / 2), 1)  # how many of the smallest to take
    lo, hi = max(0, take - b_len), min(take, a_len)
    while True:  # i from the first run, take - i from the second
        i = (lo + hi) // 2
        j = take - i
        if i < a_len and j > 0 and b(j - 1) > a(i):
            lo = i + 1
        elif i > 0 and j < b_len and a(i - 1) > b(j):
            hi = i - 1
        else:
            return max(a(i - 1) if i > 0 else -math.inf, b(j - 1) if j > 0 else -math.inf)


def auto_step_time(timeline: Timeline) -> float | None:
    """Median of step durations no longer than median + 3 x MAD (weighted by steps)."""
    work = timeline.work
    if not work.n:
        return None
    if min(work.n) == max(work.n) == 1:  # every step recorded: plain medians, sorted in C
        values = sorted(work.eff)
        median = _median(values, None)
        mad = _median_deviation(values, median)
        limit = median + 3.0 * mad
        return _median(values[: bisect.bisect_right(values, limit)], None)
    pairs = sorted(zip(map(operator.truediv, work.eff, work.n), work.n, strict=True))
    median = _weighted_median(pairs)
    mad = _weighted_median(sorted((abs(v - median), n) for v, n in pairs))
    limit = median + 3.0 * mad
    return _weighted_median([(v, n) for v, n in pairs if v <= limit])


@dataclass
class _Shares:
    """Per work interval: productive, lost and slowdown seconds."""

    productive: list[float]
    lost: list[float]
    slowdown: list[float]

    def columns(self) -> dict[str, list[float]]:
        return {
            "productive": self.productive,
            "lost_progress": self.lost,
            "slowdown": self.slowdown,
        }


def _shares(timeline: Timeline, ideal: float | None) -> _Shares:
    work = timeline.work
    eff = work.eff
    if ideal is None:
        productive = list(eff)
    elif work.n and min(work.n) == max(work.n) == 1:  # every step recorded
        # A comprehension: six times faster than map(min, ...) over a million intervals.
        productive = [e if e < ideal else ideal for e in eff]
    else:
        productive = [
            e if e < (cap := k * ideal) else cap for e, k in zip(eff, work.n, strict=True)
        ]
    slowdown = list(map(operator.sub, eff, productive))
    lost = [0.0] * len(eff)
    if any(work.lost):  # only the intervals before a rollback: few, found at C speed
        for i in itertools.compress(range(len(eff)), work.lost):
            steps, redone = work.n[i], work.lost[i]
            if redone:
                kept_share = (steps - redone) / steps
                lost[i] = eff[i] * (1.0 - kept_share)
                productive[i] *= kept_share
                slowdown[i] = eff[i] * kept_share - productive[i]
    return _Shares(productive, lost, slowdown)


def _overlay_overlap(overlays: list[tuple[float, float, str]], a: float, b: float) -> float:
    return sum(min(y, b) - max(x, a) for x, y, _ in overlays if y > a and x < b)


def _work_breakdown(
    timeline: Timeline, shares: _Shares, lo: float, hi: float, seconds: dict[str, float]
) -> None:
    """Add the work intervals' seconds within ``[lo, hi)``."""
    work = timeline.work
    first = bisect.bisect_right(work.end, lo)
    last = bisect.bisect_left(work.start, hi)  # intervals first..last-1 meet the range
    if first >= last:
        return
    inner_first = first if work.start[first] >= lo else first + 1
    inner_last = last if work.end[last - 1] <= hi else last - 1
    if inner_first < inner_last:
        for name, column in shares.columns().items():
            seconds[name] += math.fsum(column[inner_first:inner_last])
    for i in {first, last - 1}:
        if inner_first <= i < inner_last:
            continue
        a, b = max(work.start[i], lo), min(work.end[i], hi)
        if b <= a or work.eff[i] <= 0:
            continue
        clipped = max(b - a - _overlay_overlap(timeline.overlays, a, b), 0.0)
        share = clipped / work.eff[i]
        seconds["productive"] += shares.productive[i] * share
        seconds["lost_progress"] += shares.lost[i] * share
        seconds["slowdown"] += shares.slowdown[i] * share


def _base_lengths(timeline: Timeline, lo: float, hi: float, first: int) -> list[float]:
    """Per base from ``first`` on, its part within ``[lo, hi)`` not covered by an overlay."""
    overlays = timeline.overlays
    lengths: list[float] = []
    for base in timeline.bases[first:]:
        if base.start > hi:
            break
        a, b = max(base.start, lo), min(base.end, hi)
        lengths.append(max(b - a - _overlay_overlap(overlays, a, b), 0.0) if b > a else 0.0)
    return lengths


def breakdown(
    timeline: Timeline, ideal: float | None, lo: float, hi: float, shares: _Shares | None = None
) -> Breakdown:
    """The breakdown of ``[lo, hi)`` (clipped to the ledger's span)."""
    lo, hi = max(lo, timeline.start), min(hi, timeline.end)
    result = Breakdown(lo, max(hi, lo))
    if hi <= lo:
        return result
    seconds = result.seconds
    for a, b, category in timeline.overlays:
        if b > lo and a < hi:
            part = min(b, hi) - max(a, lo)
            seconds["restart" if category == "hang" else category] += part
            if category == "hang":
                result.hang_detection += part
    _work_breakdown(timeline, shares or _shares(timeline, ideal), lo, hi, seconds)
    first = bisect.bisect_right(timeline.base_ends, lo)
    lengths = _base_lengths(timeline, lo, hi, first)
    full = _full_lengths(timeline)
    for offset, length in enumerate(lengths):
        if length <= 0:
            continue
        base = timeline.bases[first + offset]
        if base.implicit and ideal is not None:
            whole = full[first + offset]
            step_share = min(ideal, whole) / whole if whole > 0 else 0.0
            work = length * step_share
            seconds["lost_progress" if base.lost else "productive"] += work
            seconds[_BASE_TO_CATEGORY.get(base.category, "idle")] += length - work
        else:
            seconds[_BASE_TO_CATEGORY.get(base.category, "idle")] += length
    return result


def _full_lengths(timeline: Timeline) -> list[float]:
    """Every base interval's uncovered seconds (cached on the timeline)."""
    if timeline.effective is None:
        timeline.effective = _base_lengths(timeline, timeline.start, timeline.end, 0)
    return timeline.effective


def compute(
    ledger: Ledger,
    reference_step_time: float | str | None = "auto",
    window_s: float | None = None,
) -> Report:
    """The report of a ledger.

    Args:
        ledger: from `read_ledger`.
        reference_step_time: ideal seconds per step, or ``"auto"`` (median of step durations
            no longer than median + 3 x MAD).
        window_s: also break the job down into consecutive windows of this many seconds.
    """
    timeline = build_timeline(ledger)
    if reference_step_time in (None, "auto"):
        ideal, source = auto_step_time(timeline), "auto"
    else:
        try:
            ideal, source = float(reference_step_time), "given"
        except (TypeError, ValueError):
            raise GoodputError(
                f"reference step time must be seconds or 'auto', not {reference_step_time!r}"
            ) from None
        if ideal <= 0:
            raise GoodputError(f"reference step time must be positive, not {ideal}")
    shares = _shares(timeline, ideal)
    whole = breakdown(timeline, ideal, timeline.start, timeline.end, shares)
    attempts = [
        AttemptRow(
            c.number,
            c.cause,
            c.timer,
            c.restore_step,
            c.last_step,
            breakdown(timeline, ideal, c.start, c.end, shares),
        )
        for c in timeline.cycles
    ]
    windows = []
    if window_s is not None:
        if window_s <= 0:
            raise GoodputError(f"the window must be positive, not {window_s}")
        lo = timeline.start
        while lo < timeline.end:
            windows.append(breakdown(timeline, ideal, lo, lo + window_s, shares))
            lo += window_s
    by_cls = by_class(
        ledger.events,
        timeline.cycles,
        [a.breakdown.seconds["lost_progress"] for a in attempts],
        lambda lo, hi: breakdown(timeline, ideal, lo, hi, shares).seconds["restart"],
        timeline.end,
    )
    google = google_steps = None
    if ledger.google is not None and ideal is not None:
        google, google_steps = ledger.google.figure(ideal), ledger.google.steps()
    return Report(
        whole=whole,
        ideal_step_time_s=ideal,
        ideal_source=source,
        initial_step=timeline.initial_step,
        final_step=timeline.final_step,
        attempts=attempts,
        windows=windows,
        warnings=list(ledger.warnings),
        events=len(ledger.events) + len(ledger.steps),
        step_events=len(ledger.steps),
        files=list(ledger.files),
        google_figure=google,
        google_steps=google_steps,
        timeline=timeline,
        notes=list(ledger.notes),
        hints=_hints(ledger, timeline),
        by_class=by_cls,
    )


STEP_LINE_HINT = (
    "add `get_recorder().step(step)` after each training step (from resiliency.goodput "
    "import get_recorder; one line, well under 2 us a call) for step-exact figures"
)


def _hints(ledger: Ledger, timeline: Timeline) -> list[str]:
    """What the user can add to the job for a better report."""
    if ledger.steps or timeline.end <= timeline.start:
        return []
    saves = len(timeline.steps) if timeline.progress_from_saves else 0
    if saves:
        return [
            f"no step events in the ledger: progress is read from the {saves} committed "
            "checkpoint step(s), so the steps after the last save are not known; " + STEP_LINE_HINT
        ]
    return ["no step events and no committed checkpoint: no progress is known; " + STEP_LINE_HINT]
