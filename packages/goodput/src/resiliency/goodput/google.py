"""Import of Google Cloud Resiliency's (ml-goodput-measurement) JSON-lines event log.

Each line has ``event_type`` in {job_started, job_terminated, checkpoint_loaded,
checkpoint_saved, user_scheduled, user_terminated}, ``timestamp`` (ISO 8601 or epoch seconds),
``job_name``, and optionally ``step`` and ``node_rank``. Lines become this package's events:
every ``job_started`` starts a cycle, ``job_terminated`` ends it, a saved checkpoint is also the
progress mark of its step (that log has no step events). `GoogleLog` keeps what Google's own
figure needs: (max saved step - min loaded step) x reference step time / (last - first event).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resiliency.goodput._time import parse_time

GOOGLE_EVENT_TYPES = (
    "job_started",
    "job_terminated",
    "checkpoint_loaded",
    "checkpoint_saved",
    "user_scheduled",
    "user_terminated",
)


@dataclass
class GoogleLog:
    """State of a Google log import: cycles so far and the inputs of Google's figure."""

    cycles: int = 0
    first_time: float | None = None
    last_time: float | None = None
    max_saved_step: int | None = None
    min_loaded_step: int | None = None
    job: str = ""

    def figure(self, reference_step_time_s: float) -> float | None:
        """Google's goodput (0..1), or None without events or a span of time."""
        if self.first_time is None or self.last_time is None or self.max_saved_step is None:
            return None
        span = self.last_time - self.first_time
        if span <= 0:
            return None
        loaded = self.min_loaded_step or 0
        return (self.max_saved_step - loaded) * reference_step_time_s / span


def _step(obj: dict[str, Any]) -> int:
    step = obj.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f"{obj['event_type']} needs an integer step, got {step!r}")
    return step


def convert_google_line(obj: Any, log: GoogleLog) -> list[tuple[float, str, dict[str, Any]]]:
    """Turn one Google log line into ``(time, event, data)`` triples of this package's schema."""
    if not isinstance(obj, dict) or obj.get("event_type") not in GOOGLE_EVENT_TYPES:
        kind = obj.get("event_type") if isinstance(obj, dict) else None
        raise ValueError(f"unknown Google event_type {kind!r}")
    kind = obj["event_type"]
    when = parse_time(obj.get("timestamp"))
    job = str(obj.get("job_name") or log.job or "default")
    log.job = job
    log.first_time = when if log.first_time is None else min(log.first_time, when)
    log.last_time = when if log.last_time is None else max(log.last_time, when)
    rank = obj.get("node_rank")
    cycle = max(log.cycles - 1, 0)
    base: dict[str, Any] = {
        "job": job,
        "node": str(rank if rank is not None else 0),
        "rank": None,
        "attempt": cycle,
        "google": True,  # imported from Google's format
    }
    out: list[tuple[float, str, dict[str, Any]]] = []
    if kind == "user_scheduled":
        out.append((when, "job_scheduled", {**base, "event": "job_scheduled"}))
    elif kind == "job_started":
        cycle = log.cycles
        log.cycles += 1
        base["attempt"] = cycle
        if cycle == 0:
            out.append((when, "job_started", {**base, "event": "job_started"}))
        out.append((when, "cycle_started", {**base, "event": "cycle_started", "cycle": cycle}))
    elif kind == "job_terminated":
        data = {**base, "event": "cycle_ended", "cycle": cycle, "cause": "crash", "ranks": []}
        out.append((when, "cycle_ended", data))
    elif kind == "user_terminated":
        data = {**base, "event": "job_ended", "exit_code": 0, "reason": "user_terminated"}
        out.append((when, "job_ended", data))
    elif kind == "checkpoint_saved":
        step = _step(obj)
        log.max_saved_step = step if log.max_saved_step is None else max(log.max_saved_step, step)
        saved = {"step": step, "tier": "persistent", "bytes": 0, "blocked_s": 0.0, "total_s": 0.0}
        out.append((when, "checkpoint_saved", {**base, "event": "checkpoint_saved", **saved}))
        out.append((when, "step", {**base, "event": "step", "step": step}))
    else:  # checkpoint_loaded
        step = _step(obj)
        log.min_loaded_step = (
            step if log.min_loaded_step is None else min(log.min_loaded_step, step)
        )
        loaded = {"step": step, "tier": "persistent", "bytes": 0, "duration_s": 0.0}
        out.append((when, "checkpoint_loaded", {**base, "event": "checkpoint_loaded", **loaded}))
    return out
