"""The step a job had reached when a fault hit it, from a ledger whose step events are sampled.

The goodput recorder writes at most one ``step`` event per ``step_interval_s`` (1 s by default),
plus the newest step at each flush (every ``flush_interval_s``). A rank killed between two
flushes takes its newest steps with it: the newest step event before a kill can be several steps
behind the step the job had really reached, and those unrecorded steps are redone after the
restart all the same. So the step at the fault is estimated from every event that names a step
done (step samples, checkpoint saves, the emergency save of a preemption), and the unrecorded
tail after the newest step sample is filled in at the rate the samples show, over at most the
longest gap between two samples; a tail much longer than that gap has seen a flush that wrote no
newer step, so the job was not stepping and nothing is filled in. The result is an estimate,
within a step or so of the truth when the job stepped at an even pace.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["step_at_fault"]

# Events whose ``step`` is a step the job had finished (a save starts after its step).
_STEP_EVENTS = frozenset({"checkpoint_save_started", "checkpoint_saved", "preempted"})
# Events that start an attempt: what the job did before one is no progress of the next.
_START_EVENTS = frozenset({"cycle_started", "checkpoint_load_started", "checkpoint_loaded"})
# A tail this many sampling gaps long has seen a flush (two: a late flush on a loaded machine).
_FLUSHED_AFTER_GAPS = 2.0
# Samples the rate is measured over: recent enough to follow a change of speed.
_RATE_SAMPLES = 10


def step_at_fault(
    timeline: Sequence[tuple[float, Mapping[str, Any]]],
    at: float,
    until: float,
    attempt: Any,
) -> int | None:
    """Estimate the highest step the job finished before the fault at ``at`` stopped it.

    Args:
        timeline: the job's events as ``(wall time, fields)``, in time order.
        at: when the fault was injected (wall time).
        until: when the job was seen to stop (the detection; ``at`` when nothing was seen):
            a preempted job goes on to its stop step and saves it after the injection.
        attempt: the restart count the job was in at ``at``. Only this attempt's progress
            counts: events from its start (its newest cycle start or checkpoint load before
            ``at``) on, steps of this restart count.

    Returns:
        The estimated step, or None when no event before ``until`` names a step.
    """
    since = max(
        (t for t, e in timeline if t <= at and e.get("event") in _START_EVENTS), default=-math.inf
    )
    samples = [
        (t, int(e["step"]))
        for t, e in timeline
        if since <= t <= at and e.get("event") == "step" and e.get("attempt", attempt) == attempt
    ]
    known = [
        int(e["step"])
        for t, e in timeline
        if since <= t <= until and e.get("event") in _STEP_EVENTS and e.get("step") is not None
    ]
    known += [step for _, step in samples]
    if not known:
        return None
    return max(*known, _extrapolated(samples[-_RATE_SAMPLES:], at))


def _extrapolated(samples: list[tuple[float, int]], at: float) -> int:
    """The newest sample plus the steps its rate fits into the unrecorded tail before ``at``."""
    if len(samples) < 2:
        return samples[-1][1] if samples else 0
    (t_first, s_first), (t_last, s_last) = samples[0], samples[-1]
    if t_last <= t_first or s_last <= s_first:
        return s_last  # no progress between the samples: no rate to fill the tail with
    rate = (s_last - s_first) / (t_last - t_first)
    longest_gap = max(b[0] - a[0] for a, b in itertools.pairwise(samples))
    if at - t_last > _FLUSHED_AFTER_GAPS * longest_gap:
        # The recorder flushed since the newest sample and wrote no newer step: the job had
        # stopped stepping (a slow save, an evaluation), so the newest sample is its step.
        return s_last
    tail = min(at - t_last, longest_gap)
    # A step counts once it finished: a partly done step at the fault was not done.
    return s_last + math.floor(tail * rate + 1e-9)
