"""Google Cloud Resiliency's goodput tracker log: its lines, and Google's own figure.

Google's tracker writes one JSON line per event: ``event_type`` in {user_scheduled,
job_started, checkpoint_loaded, checkpoint_saved, job_terminated, user_terminated},
``timestamp`` from ``datetime.now().isoformat()`` (local wall time, **no time zone**),
``job_name``, and ``step`` and ``node_rank`` as floats (``40.0``). Every node writes its own
``job_started`` and ``job_terminated``, so a cycle of a 100-node job is 100 starts and 100 ends.

This module reads those lines into `GoogleRecord` and computes Google's figure the way its
published calculator does (see `GoogleLog.figure`). Turning the records into this package's
events (per-node starts grouped into cycles) is `resiliency.goodput._google_cycles`' job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

GOOGLE_EVENT_TYPES = (
    "user_scheduled",
    "job_started",
    "checkpoint_loaded",
    "checkpoint_saved",
    "job_terminated",
    "user_terminated",
)
# Ties in time are ordered as a job unfolds (a start before the load it leads to).
_KIND_ORDER = {kind: i for i, kind in enumerate(GOOGLE_EVENT_TYPES)}


@dataclass(frozen=True)
class GoogleRecord:
    """One line of a Google log.

    ``time`` is epoch seconds (a naive time read in the reader's zone); ``wall`` is the same
    moment as Google's calculator sees it, in whole microseconds: a naive time's wall-clock
    reading taken as UTC (its differences are wall-clock differences, whatever the zone, and
    exact, like the differences of Python datetimes that Google's calculator takes).
    """

    time: float
    wall: int
    kind: str
    job: str
    node: str
    step: int | None
    source: str
    line: int

    @property
    def order(self) -> tuple[float, int]:
        return (self.time, _KIND_ORDER[self.kind])


def _whole(obj: dict[str, Any], name: str) -> int | None:
    """A whole number written as an int or a float (``40.0``), None when absent."""
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(value)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


def _times(value: Any, zone: tzinfo) -> tuple[float, int, bool]:
    """``(epoch, wall microseconds, naive)`` of a timestamp (ISO 8601 or epoch seconds)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), round(float(value) * 1e6), False
    if not isinstance(value, str):
        raise ValueError(f"not a timestamp: {value!r}")
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not an ISO 8601 timestamp: {value!r}") from None
    if moment.tzinfo is None:
        wall = (moment.replace(tzinfo=timezone.utc) - _EPOCH) // _MICROSECOND
        return moment.replace(tzinfo=zone).timestamp(), wall, True
    return moment.timestamp(), (moment - _EPOCH) // _MICROSECOND, False


@dataclass
class _JobFigures:
    """What Google's figure needs, for one ``job_name``."""

    first: tuple[float, int]
    first_wall: int
    last_wall: int
    max_saved: int = 0
    min_loaded: float = math.inf


@dataclass
class GoogleLog:
    """The Google records read so far, and the inputs of Google's figure per job.

    Args:
        zone: the zone naive timestamps are read in (Google's tracker writes local time).
    """

    zone: tzinfo = timezone.utc
    records: list[GoogleRecord] = field(default_factory=list)
    naive: int = 0
    jobs: dict[str, _JobFigures] = field(default_factory=dict)

    def add(self, obj: Any, source: str, line: int) -> GoogleRecord:
        """Read one line; raises ValueError (with the reason) for a line to skip."""
        kind = obj.get("event_type") if isinstance(obj, dict) else None
        if kind not in GOOGLE_EVENT_TYPES:
            raise ValueError(f"unknown Google event_type {kind!r}")
        when, wall, naive = _times(obj.get("timestamp"), self.zone)
        step = _whole(obj, "step")
        if kind in ("checkpoint_loaded", "checkpoint_saved") and step is None:
            raise ValueError(f"{kind} needs an integer step (a whole number), got none")
        node = _whole(obj, "node_rank")
        record = GoogleRecord(
            when,
            wall,
            kind,
            str(obj.get("job_name") or "default"),
            "0" if node is None else str(node),
            step,
            source,
            line,
        )
        self.naive += naive
        self.records.append(record)
        self._account(record)
        return record

    def _account(self, record: GoogleRecord) -> None:
        job = self.jobs.get(record.job)
        if job is None:
            job = self.jobs[record.job] = _JobFigures(record.order, record.wall, record.wall)
        if record.order < job.first:
            job.first, job.first_wall = record.order, record.wall
        job.last_wall = max(job.last_wall, record.wall)
        if record.kind == "checkpoint_saved" and record.step is not None:
            job.max_saved = max(job.max_saved, record.step)
        elif record.kind == "checkpoint_loaded" and record.step is not None:
            job.min_loaded = min(job.min_loaded, record.step)

    @property
    def job(self) -> str | None:
        """The job Google's calculator reports on: the one of the earliest event."""
        if not self.jobs:
            return None
        return min(self.jobs.items(), key=lambda item: item[1].first)[0]

    def figure(self, reference_step_time_s: float) -> float | None:
        """Google's goodput (0..1) as its calculator computes it, None for an empty log.

        (max saved step - min loaded step) x reference step time / (last - first event time),
        over the events of the earliest event's job, time differences taken on the wall clock.
        Like Google's calculator, it is 0 when no checkpoint was loaded, none saved above step
        0, or the steps did not move forward. Collapsing consecutive starts and ends (its
        preprocessing) changes its event counts, not this figure.
        """
        name = self.job
        if name is None:
            return None
        job = self.jobs[name]
        span = (job.last_wall - job.first_wall) / 1e6
        if span <= 0:
            return None
        if math.isinf(job.min_loaded) or job.max_saved <= 0 or job.max_saved <= job.min_loaded:
            return 0.0
        return (job.max_saved - job.min_loaded) * reference_step_time_s / span

    def steps(self) -> tuple[int | None, int | None]:
        """``(min loaded step, max saved step)`` of Google's figure (None where absent)."""
        name = self.job
        if name is None:
            return None, None
        job = self.jobs[name]
        loaded = None if math.isinf(job.min_loaded) else int(job.min_loaded)
        return loaded, job.max_saved or None
