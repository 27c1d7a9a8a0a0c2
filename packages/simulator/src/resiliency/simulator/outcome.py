"""What each injected fault did to the job, read back from the job's goodput ledger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from resiliency.goodput import Ledger
from resiliency.simulator._steps_at_fault import step_at_fault
from resiliency.simulator.runner import Injection

__all__ = ["FaultOutcome", "format_table", "outcomes", "timeline_of"]

# An in-process restart (resiliency.inprocess.Wrapper) ends no cycle: its own event is both the
# detection and the job's new start, in the same processes.
_DETECTION_EVENTS = frozenset(
    {"hang_detected", "cycle_ended", "job_ended", "preempted", "inprocess_restart"}
)
# A launcher that writes no events (torchrun) shows its restarts only through its workers: a
# restarted worker starting to load, or steps under another restart count.
_RESTART_EVENTS = frozenset({"checkpoint_load_started"})
_START_EVENTS = frozenset({"cycle_started", "checkpoint_load_started", "inprocess_restart"})
# The step the job resumed from: a checkpoint load, or, in-process, the step the ranks agreed
# on when healing from a peer or rolling back to the local tier.
_RESUME_EVENTS = frozenset({"checkpoint_loaded", "inprocess_heal", "inprocess_rollback"})


@dataclass(frozen=True)
class FaultOutcome:
    """One fault, with the moments that matter, in seconds since the job started.

    Attributes:
        kind: the fault kind.
        victim: what was hit (``rank 3``, ``node 1``, a directory).
        injected_s: when it was injected; None when it could not be.
        detected_s: the first hang, cycle end, preemption, job end or in-process restart
            after it, if any; for a
            launcher that writes no events, the first sign of a restart (a worker loading a
            checkpoint, a step under another restart count).
        recovered_s: the first training step after the job started again (after detection),
            if any; the first step after detection when nothing restarted.
        steps_lost: the steps done before the fault that were done again after it: the step
            the job had reached (`step_at_fault`: step events are sampled, so the newest one
            can be behind) minus the step it resumed from (a checkpoint load's, or an
            in-process heal's or rollback's agreed step).
        note: why it was not injected, or what was done.
    """

    kind: str
    victim: str
    injected_s: float | None
    detected_s: float | None
    recovered_s: float | None
    steps_lost: int | None
    note: str


def timeline_of(ledger: Ledger) -> list[tuple[float, dict[str, Any]]]:
    """Every event of a goodput ledger, steps included, as ``(wall time, fields)`` in order."""
    merged = [(e.time, {**e.data, "event": e.event}) for e in ledger.events]
    merged.extend(
        (t, {"event": "step", "step": step, "attempt": attempt})
        for t, step, attempt in ledger.steps
    )
    merged.sort(key=lambda pair: pair[0])
    return merged


def outcomes(
    injections: list[Injection], timeline: Sequence[tuple[float, Mapping[str, Any]]], t0_wall: float
) -> list[FaultOutcome]:
    """Match each injection with what the ledger says happened after it.

    Args:
        injections: what the runner injected, in order.
        timeline: the job's events as ``(wall time, fields)``, in time order (`timeline_of`).
        t0_wall: the job's start, wall-clock seconds.

    Returns:
        One outcome per injection.
    """
    result: list[FaultOutcome] = []
    for inj in injections:
        if inj.injected_wall is None or inj.error:
            result.append(
                FaultOutcome(inj.fault.kind, inj.victim, None, None, None, None, inj.error)
            )
            continue
        at = inj.injected_wall
        steps_before = [e for t, e in timeline if t <= at and e.get("event") == "step"]
        attempt = steps_before[-1].get("attempt") if steps_before else _cycle_before(timeline, at)
        detected = next(
            (
                t
                for t, e in timeline
                if t > at
                and (
                    e.get("event") in _DETECTION_EVENTS
                    or e.get("event") in _RESTART_EVENTS
                    or (e.get("event") == "step" and e.get("attempt", attempt) != attempt)
                )
            ),
            None,
        )
        after = detected if detected is not None else at
        # Recovery is the first step of the job's next start (a preempted rank still records
        # the step it stopped at), or, when nothing restarted, the first step after detection.
        after = next(
            (t for t, e in timeline if t >= after and e.get("event") in _START_EVENTS), after
        )
        first_step = next(
            (
                (t, e)
                for t, e in timeline
                # a step under a new restart count is both the detection and the recovery
                if (t > after or (t == detected and e.get("attempt", attempt) != attempt))
                and e.get("event") == "step"
            ),
            None,
        )
        loaded = next(
            (
                int(e["step"])
                for t, e in timeline
                if after < t <= (first_step[0] if first_step else float("inf"))
                and e.get("event") in _RESUME_EVENTS
            ),
            None,
        )
        reached = step_at_fault(timeline, at, at if detected is None else detected, attempt)
        lost: int | None = None
        if reached is not None and first_step is not None:
            resumed_from = loaded if loaded is not None else int(first_step[1]["step"]) - 1
            lost = max(0, reached - resumed_from)
        result.append(
            FaultOutcome(
                kind=inj.fault.kind,
                victim=inj.victim,
                injected_s=at - t0_wall,
                detected_s=None if detected is None else detected - t0_wall,
                recovered_s=None if first_step is None else first_step[0] - t0_wall,
                steps_lost=lost,
                note=inj.action,
            )
        )
    return result


def _cycle_before(timeline: Sequence[tuple[float, Mapping[str, Any]]], at: float) -> int:
    """The restart count the job was in at ``at`` when it had not stepped yet.

    A fault can land while the first cycle is still starting (a loaded machine); its first step
    is then no sign of a restart.
    """
    starts = [e for t, e in timeline if t <= at and e.get("event") == "cycle_started"]
    return int(starts[-1].get("cycle", 0)) if starts else 0


def _cell(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def format_table(rows: list[FaultOutcome]) -> str:
    """Render the outcomes as a fixed-width table, one row per fault."""
    header = ("#", "fault", "victim", "injected s", "detected s", "recovered s", "steps lost")
    lines = [header]
    for i, row in enumerate(rows, 1):
        lines.append(
            (
                str(i),
                row.kind,
                row.victim or "-",
                _cell(row.injected_s),
                _cell(row.detected_s),
                _cell(row.recovered_s),
                _cell(row.steps_lost),
            )
        )
    widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    ]
    for i, row in enumerate(rows, 1):
        if row.injected_s is None:
            text.append(f"  #{i} not injected: {row.note}")
    return "\n".join(text)
