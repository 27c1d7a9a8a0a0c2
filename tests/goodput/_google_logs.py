"""Google Cloud Resiliency tracker logs as its tracker writes them, and its calculator's logic.

The lines have the tracker's shape: ``timestamp`` from ``datetime.now().isoformat()`` (local
wall time, no zone; no fraction when the microseconds are 0), ``step`` and ``node_rank`` as
floats, and every node writing its own ``job_started`` and ``job_terminated``.

`google_calculator` is Google's published calculator logic, written here from its formula and
preprocessing (not its code): sort by the timestamp string, keep the first event's job, collapse
consecutive ``job_started`` (and ``job_terminated``) lines to the last one, then (max saved step
- min loaded step) x reference step time / (last - first event time); 0 when no checkpoint was
loaded or none saved above step 0.
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta
from typing import Any

GOOGLE_ORDER = {
    "user_scheduled": 0,
    "job_started": 1,
    "checkpoint_loaded": 2,
    "checkpoint_saved": 3,
    "job_terminated": 4,
    "user_terminated": 5,
}
LOCAL_T0 = datetime(2025, 4, 2, 6, 8, 24, 318726)  # naive: the tracker's local wall time


def google_line(
    kind: str, when: datetime, job: str = "llm", **fields: float | None
) -> dict[str, Any]:
    """One line as the tracker writes it (``when`` naive; numbers as floats)."""
    out: dict[str, Any] = {"event_type": kind, "timestamp": when.isoformat(), "job_name": job}
    for name, value in fields.items():
        if value is not None:
            out[name] = float(value)
    return out


def google_calculator(lines: list[dict[str, Any]], reference_step_s: float) -> dict[str, Any]:
    """Google's figure and counts for ``lines`` (see the module docstring)."""
    events = sorted(lines, key=lambda e: e.get("timestamp", ""))
    job = events[0].get("job_name")
    events = [e for e in events if e.get("job_name") == job]
    events.sort(key=lambda e: (e["timestamp"], GOOGLE_ORDER.get(e["event_type"], math.inf)))
    kept: list[dict[str, Any]] = []
    for event in events:
        kind = event["event_type"]
        if kind in ("job_started", "job_terminated") and kept and kept[-1]["event_type"] == kind:
            kept.pop()  # a run of starts (or ends) counts as its last one
        kept.append(event)
    span = (
        datetime.fromisoformat(kept[-1]["timestamp"]) - datetime.fromisoformat(kept[0]["timestamp"])
    ).total_seconds()
    loaded = min(
        (e.get("step", 0) for e in kept if e["event_type"] == "checkpoint_loaded"),
        default=math.inf,
    )
    saved = max(
        (e.get("step", 0) for e in kept if e["event_type"] == "checkpoint_saved"), default=0
    )
    goodput = 0.0
    if loaded != math.inf and saved > 0 and saved - loaded > 0 and span > 0:
        goodput = (saved - loaded) * reference_step_s / span
    return {
        "goodput": goodput,
        "job_started_count": sum(e["event_type"] == "job_started" for e in kept),
        "span_s": span,
        "min_loaded_step": loaded,
        "max_saved_step": saved,
    }


def large_google_job(
    nodes: int = 112,
    restarts: int = 30,
    seed: int = 0,
    step_s: float = 2.0,
    save_every: int = 50,
    load_first: bool = False,
) -> list[dict[str, Any]]:
    """A large job's log, lines shuffled: ``restarts`` failures, each followed by a restart.

    Every node writes its start (within 20 s of the others), its load of the last saved step
    (after every node started), its saves (within a second of each other) and its end (within 5 s
    of the others, after the failure). A failure loses the steps after the last save. The first
    cycle starts from scratch, with no load unless ``load_first``.
    """
    rng = random.Random(seed)
    out = [google_line("user_scheduled", LOCAL_T0, node_rank=0)]
    now = LOCAL_T0 + timedelta(seconds=90)
    saved = 0
    for cycle in range(restarts + 1):
        for node in range(nodes):
            delay = timedelta(seconds=rng.uniform(0, 20))
            out.append(google_line("job_started", now + delay, node_rank=node))
        now += timedelta(seconds=30)
        if cycle > 0 or load_first:
            for node in range(nodes):
                delay = timedelta(seconds=rng.uniform(0, 10))
                out.append(
                    google_line("checkpoint_loaded", now + delay, step=saved, node_rank=node)
                )
        now += timedelta(seconds=15)
        steps = rng.randint(3 * save_every, 12 * save_every)
        step = saved
        for _ in range(steps):
            step += 1
            now += timedelta(seconds=step_s * rng.uniform(0.95, 1.3))
            if step % save_every == 0:
                for node in range(nodes):
                    delay = timedelta(seconds=rng.uniform(0, 1))
                    out.append(
                        google_line("checkpoint_saved", now + delay, step=step, node_rank=node)
                    )
                now += timedelta(seconds=1)
                saved = step
        now += timedelta(seconds=rng.uniform(0, 60))  # the failure (or the end of the job)
        for node in range(nodes):
            delay = timedelta(seconds=rng.uniform(0, 5))
            out.append(google_line("job_terminated", now + delay, node_rank=node))
        now += timedelta(seconds=rng.uniform(60, 300))  # until the restart
    out.append(google_line("user_terminated", now, node_rank=0))
    rng.shuffle(out)
    return out


def worked_example_google() -> list[dict[str, Any]]:
    """The field's worked example (minutes; steps of 2 min) as Google's tracker writes it.

    Two nodes, naive local times, float steps and node ranks: job started at 0; step 25
    loaded by 5; step 50 saved by 60; crash at 100; restarted at 115; step 50 loaded by 120;
    step 75 saved by 200; terminated at 200.
    """

    def at(minute: float) -> datetime:
        return LOCAL_T0 + timedelta(minutes=minute)

    out = []
    for node in (0, 1):
        out += [
            google_line("job_started", at(0), node_rank=node),
            google_line("checkpoint_loaded", at(5), step=25, node_rank=node),
            google_line("checkpoint_saved", at(60), step=50, node_rank=node),
            google_line("job_terminated", at(100), node_rank=node),
            google_line("job_started", at(115), node_rank=node),
            google_line("checkpoint_loaded", at(120), step=50, node_rank=node),
            google_line("checkpoint_saved", at(200), step=75, node_rank=node),
            google_line("job_terminated", at(200), node_rank=node),
        ]
    return out
