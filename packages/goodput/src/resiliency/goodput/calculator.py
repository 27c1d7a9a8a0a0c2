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
from dataclasses import dataclass, field
from typing import Any

from resiliency.goodput.errors import GoodputError
from resiliency.goodput.ledger import Ledger
from resiliency.goodput.timeline import Timeline, build_timeline

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
    timeline: Timeline | None = None

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
            "google_goodput": self.google_figure,
            "warnings": self.warnings,
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


def auto_step_time(timeline: Timeline) -> float | None:
    """Median of step durations no longer than median + 3 x MAD (weighted by steps)."""
    eff = _full_lengths(timeline)
    pairs = sorted(
        (length / b.steps, b.steps)
        for b, length in zip(timeline.bases, eff, strict=True)
        if b.category == "work" and length > 0
    )
    if not pairs:
        return None
    median = _weighted_median(pairs)
    mad = _weighted_median(sorted((abs(v - median), n) for v, n in pairs))
    limit = median + 3.0 * mad
    kept = [(v, n) for v, n in pairs if v <= limit]
    return _weighted_median(kept)


def _effective_lengths(
    timeline: Timeline, lo: float, hi: float, first: int
) -> tuple[dict[str, float], list[float]]:
    """Overlay seconds within ``[lo, hi)`` and, per base from ``first`` on, its uncovered part."""
    overlays = timeline.overlays
    covered: dict[str, float] = {"loading": 0.0, "saving": 0.0, "hang": 0.0}
    for a, b, category in overlays:
        if b > lo and a < hi:
            covered[category] += min(b, hi) - max(a, lo)
    lengths: list[float] = []
    j = bisect.bisect_right([o[1] for o in overlays], lo) if overlays else 0
    n_over = len(overlays)
    for base in timeline.bases[first:]:
        if base.start > hi:
            break
        a, b = max(base.start, lo), min(base.end, hi)
        if b <= a:
            lengths.append(0.0)
            continue
        length = b - a
        while j < n_over and overlays[j][1] <= a:
            j += 1
        k = j
        while k < n_over and overlays[k][0] < b:
            length -= min(overlays[k][1], b) - max(overlays[k][0], a)
            k += 1
        lengths.append(max(length, 0.0))
    return covered, lengths


def breakdown(timeline: Timeline, ideal: float | None, lo: float, hi: float) -> Breakdown:
    """The breakdown of ``[lo, hi)`` (clipped to the ledger's span)."""
    lo, hi = max(lo, timeline.start), min(hi, timeline.end)
    result = Breakdown(lo, max(hi, lo))
    if hi <= lo:
        return result
    seconds = result.seconds
    ends = [b.end for b in timeline.bases]
    first = bisect.bisect_right(ends, lo)
    covered, lengths = _effective_lengths(timeline, lo, hi, first)
    seconds["loading"] += covered["loading"]
    seconds["saving"] += covered["saving"]
    seconds["restart"] += covered["hang"]
    result.hang_detection = covered["hang"]
    full = _full_lengths(timeline)
    for offset, length in enumerate(lengths):
        if length <= 0:
            continue
        base = timeline.bases[first + offset]
        if base.category == "work":
            whole = full[first + offset]
            per_step = whole / base.steps
            kept_share = (base.steps - base.lost) / base.steps
            seconds["lost_progress"] += length * (1.0 - kept_share)
            kept = length * kept_share
            if ideal is None or per_step <= ideal:
                seconds["productive"] += kept
            else:
                useful = kept * ideal / per_step
                seconds["productive"] += useful
                seconds["slowdown"] += kept - useful
        elif base.implicit and ideal is not None:
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
        timeline.effective = _effective_lengths(timeline, timeline.start, timeline.end, 0)[1]
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
    whole = breakdown(timeline, ideal, timeline.start, timeline.end)
    attempts = [
        AttemptRow(
            c.number,
            c.cause,
            c.timer,
            c.restore_step,
            c.last_step,
            breakdown(timeline, ideal, c.start, c.end),
        )
        for c in timeline.cycles
    ]
    windows = []
    if window_s is not None:
        if window_s <= 0:
            raise GoodputError(f"the window must be positive, not {window_s}")
        lo = timeline.start
        while lo < timeline.end:
            windows.append(breakdown(timeline, ideal, lo, lo + window_s))
            lo += window_s
    google = None
    if ledger.google is not None and ideal is not None:
        google = ledger.google.figure(ideal)
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
        timeline=timeline,
    )
