"""How often to checkpoint, from a job's own ledger (``resiliency-goodput advise``).

The ledger holds every input of the classic optimum:

* the **MTBF** ``M``: the ledger's wall time over its failures (cycles that ended in a crash, a
  hang or a preemption), with a 90 % confidence range (chi-square bounds of an exponential
  failure process observed for a fixed time);
* per tier, the **blocking cost of a save** ``d`` (median ``blocked_s``), the **restore cost**
  (median ``duration_s`` of its loads) and the current **interval**: the work between two saves
  of one cycle (from the end of a save's blocking to the start of the next save, median), what
  a "save every N steps" setting sets (N x the step time);
* the **restart cost** (mean restart & recovery time per restart, loading excluded).

The advised interval (work between saves, like the current one) is Daly's higher-order
optimum (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
dumps", FGCS 22, 2006), Young's ``sqrt(2 d M)`` with corrections, for ``d < 2 M`` (else ``M``)::

    t = sqrt(2 d M) * (1 + sqrt(d / (2 M)) / 3 + (d / (2 M)) / 9) - d

never shorter than a save's own duration (a save cannot start before the previous one
committed). The predicted goodput of an interval ``t`` is Daly's model of the wall time per
unit of work, with the restart ``R`` (restart + the tier's restore) taken into account::

    goodput(t) = t / (M * exp(R / M) * (exp((t + d) / M) - 1))

times the measured step efficiency (ideal over actual step time of the kept steps). The
optimum of that model does not depend on ``R``: the restart and restore costs change the
goodput, not the interval. Each tier is advised as if it were the job's only one.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from resiliency.goodput.calculator import Report, compute
from resiliency.goodput.ledger import Ledger

FAILURE_CAUSES = ("crash", "hang", "preemption")
MIN_FAILURES = 3
"""Fewer failures than this say nothing useful about the MTBF: no advice."""
CONFIDENCE = 0.90


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval (1974): ``sqrt(2 d M)``."""
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum checkpoint interval (2006), seconds of work between saves."""
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - save_s


def predicted_goodput(interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's model: the share of wall time that is work, for exponential failures."""
    if interval_s <= 0 or mtbf_s <= 0:
        return 0.0
    expected = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + save_s) / mtbf_s)
    return interval_s / expected


def _chi2_quantile(p: float, dof: int) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (stdlib only)."""
    z = statistics.NormalDist().inv_cdf(p)
    h = 2.0 / (9.0 * dof)
    return dof * max(1.0 - h + z * math.sqrt(h), 0.0) ** 3


def mtbf_range(running_s: float, failures: int) -> tuple[float | None, float | None]:
    """90 % confidence range of the MTBF for ``failures`` seen in ``running_s`` seconds."""
    alpha = 1.0 - CONFIDENCE
    low = 2.0 * running_s / _chi2_quantile(1.0 - alpha / 2.0, 2 * failures + 2)
    if failures == 0:
        return low, None
    return low, 2.0 * running_s / _chi2_quantile(alpha / 2.0, 2 * failures)


@dataclass
class TierAdvice:
    """Costs, current and advised interval of one checkpoint tier."""

    tier: str
    saves: int
    save_blocked_s: float
    save_total_s: float
    restore_s: float | None
    interval_s: float | None
    advised_interval_s: float | None = None
    young_interval_s: float | None = None
    goodput_now: float | None = None
    goodput_advised: float | None = None
    step_time_s: float | None = None
    restart_s: float | None = None

    def steps(self, seconds: float | None) -> int | None:
        """An interval in training steps (at the ideal step time), at least 1."""
        if seconds is None or not self.step_time_s:
            return None
        return max(round(seconds / self.step_time_s), 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "saves": self.saves,
            "save_blocked_s": self.save_blocked_s,
            "save_total_s": self.save_total_s,
            "restore_s": self.restore_s,
            "restart_s": self.restart_s,
            "interval_s": self.interval_s,
            "interval_steps": self.steps(self.interval_s),
            "advised_interval_s": self.advised_interval_s,
            "advised_interval_steps": self.steps(self.advised_interval_s),
            "young_interval_s": self.young_interval_s,
            "goodput_now": self.goodput_now,
            "goodput_advised": self.goodput_advised,
        }


@dataclass
class Advice:
    """Everything ``resiliency-goodput advise`` prints."""

    running_s: float
    failures: int
    mtbf_s: float | None
    mtbf_low_s: float | None
    mtbf_high_s: float | None
    restarts: int
    restart_s: float | None
    step_efficiency: float
    ideal_step_time_s: float | None
    tiers: list[TierAdvice] = field(default_factory=list)
    more_hours_needed: float | None = None
    primary: str | None = None

    @property
    def enough(self) -> bool:
        """Whether there were enough failures to advise."""
        return self.failures >= MIN_FAILURES

    def _primary(self) -> TierAdvice | None:
        return next((t for t in self.tiers if t.tier == self.primary), None)

    def to_json(self) -> dict[str, Any]:
        primary = self._primary()
        return {
            "enough_failures": self.enough,
            "failures": self.failures,
            "running_s": self.running_s,
            "mtbf_s": self.mtbf_s,
            "mtbf_low_s": self.mtbf_low_s,
            "mtbf_high_s": self.mtbf_high_s,
            "confidence": CONFIDENCE,
            "restarts": self.restarts,
            "restart_s": self.restart_s,
            "step_efficiency": self.step_efficiency,
            "ideal_step_time_s": self.ideal_step_time_s,
            "more_hours_needed": self.more_hours_needed,
            "primary_tier": self.primary,
            "goodput_now": primary.goodput_now if primary else None,
            "goodput_advised": primary.goodput_advised if primary else None,
            "tiers": [t.to_json() for t in self.tiers],
        }


def _tier_costs(ledger: Ledger, step_time: float | None) -> list[TierAdvice]:
    """Per tier: save costs, restore cost and current interval, from the ledger's events."""
    blocked: dict[str, list[float]] = defaultdict(list)
    total: dict[str, list[float]] = defaultdict(list)
    restores: dict[str, list[float]] = defaultdict(list)
    gaps: dict[str, list[float]] = defaultdict(list)
    # Every node (rank) that records writes its own event for the same save: a gap is between
    # two saves of one writer, never between two writers' events of one save (about 0 s).
    # Per writer, its last save: (step, start, blocking seconds, index in the tier's lists).
    last: dict[tuple[str, int, str, Any], tuple[Any, float, float, int]] = {}
    for ev in ledger.events:
        data = ev.data
        if ev.event == "checkpoint_saved":
            tier = str(data["tier"])
            start = ev.time - float(data["total_s"])
            writer = (tier, ev.attempt, ev.node, data.get("rank"))
            previous = last.get(writer)
            if previous is not None and previous[0] == data.get("step"):
                # One save written as two files (Lightning's ModelCheckpoint with save_last:
                # step=N.ckpt, then last.ckpt): one save that blocked for both.
                index = previous[3]
                blocked[tier][index] += float(data["blocked_s"])
                total[tier][index] = ev.time - previous[1]
                last[writer] = (previous[0], previous[1], blocked[tier][index], index)
                continue
            blocked[tier].append(float(data["blocked_s"]))
            total[tier].append(float(data["total_s"]))
            if previous is not None:  # work between the two saves: the first one's block out
                gaps[tier].append(start - previous[1] - previous[2])
            last[writer] = (
                data.get("step"),
                start,
                float(data["blocked_s"]),
                len(blocked[tier]) - 1,
            )
        elif ev.event == "checkpoint_loaded" and not data.get("synthetic"):
            restores[str(data["tier"])].append(float(data["duration_s"]))
    return [
        TierAdvice(
            tier=tier,
            saves=len(blocked[tier]),
            save_blocked_s=statistics.median(blocked[tier]),
            save_total_s=statistics.median(total[tier]),
            restore_s=statistics.median(restores[tier]) if restores[tier] else None,
            interval_s=statistics.median(gaps[tier]) if gaps[tier] else None,
            step_time_s=step_time,
        )
        for tier in sorted(blocked)
    ]


def advise(
    ledger: Ledger,
    reference_step_time: float | str | None = "auto",
    report: Report | None = None,
) -> Advice:
    """Checkpoint advice from a ledger (see the module docstring).

    Args:
        ledger: from `read_ledger`.
        reference_step_time: ideal seconds per step, or ``"auto"``.
        report: the ledger's report, if already computed.
    """
    report = report or compute(ledger, reference_step_time)
    whole = report.whole
    # A cycle with no recorded end (no launcher wrote one: torchrun with the recorder's
    # callbacks) that another cycle follows ended in a failure all the same.
    attempts = report.attempts
    failures = sum(
        a.cause in FAILURE_CAUSES or (a.cause is None and i + 1 < len(attempts))
        for i, a in enumerate(attempts)
    )
    running = whole.total
    kept = whole.seconds["productive"] + whole.seconds["slowdown"]
    efficiency = whole.seconds["productive"] / kept if kept > 0 else 1.0
    restart = whole.seconds["restart"] / report.restarts if report.restarts else None
    low, high = mtbf_range(running, failures) if running > 0 else (None, None)
    advice = Advice(
        running_s=running,
        failures=failures,
        mtbf_s=running / failures if failures else None,
        mtbf_low_s=low,
        mtbf_high_s=high,
        restarts=report.restarts,
        restart_s=restart,
        step_efficiency=efficiency,
        ideal_step_time_s=report.ideal_step_time_s,
        tiers=_tier_costs(ledger, report.ideal_step_time_s),
    )
    if advice.tiers:
        # The tier saved most often is the one a restart restores from.
        advice.primary = min(advice.tiers, key=lambda t: t.interval_s or math.inf).tier
    if not advice.enough:
        # At the rate seen so far (or, without a failure, at least one per ledger span).
        per_failure = running / failures if failures else running
        advice.more_hours_needed = (MIN_FAILURES - failures) * per_failure / 3600.0
        return advice
    mtbf = running / failures
    for tier in advice.tiers:
        restart_s = (restart or 0.0) + (tier.restore_s or 0.0)
        blocked = tier.save_blocked_s
        tier.restart_s = restart
        if blocked <= 0 and tier.save_total_s <= 0:
            continue  # saves without a cost (e.g. imported from Google's log): nothing to weigh
        tier.young_interval_s = young_interval(blocked, mtbf)
        tier.advised_interval_s = max(daly_interval(blocked, mtbf), tier.save_total_s)
        tier.goodput_advised = efficiency * predicted_goodput(
            tier.advised_interval_s, blocked, restart_s, mtbf
        )
        if tier.interval_s is not None:
            tier.goodput_now = efficiency * predicted_goodput(
                tier.interval_s, blocked, restart_s, mtbf
            )
    return advice
