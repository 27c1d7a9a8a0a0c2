"""Hand-written ledgers for the tests: the worked example and helpers to write lines."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

T0 = datetime(2026, 11, 23, 0, 0, tzinfo=timezone.utc)
MIN = 60.0


def line(
    event: str,
    minute: float,
    *,
    node: str = "0",
    rank: int | None = None,
    attempt: int = 0,
    job: str = "job",
    **fields: Any,
) -> dict[str, Any]:
    """One ledger line at ``minute`` minutes after T0."""
    return {
        "schema": 1,
        "job": job,
        "event": event,
        "time": (T0 + timedelta(minutes=minute)).isoformat(),
        "mono": 1000.0 + minute * MIN,
        "node": node,
        "rank": rank,
        "attempt": attempt,
        **fields,
    }


def write(path: Path, lines: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + tail, encoding="utf-8")
    return path


def worked_example(dense: bool = False) -> list[dict[str, Any]]:
    """The field's worked example (minutes; steps of 2 min): goodput 50 %.

    job started 0; step 25 loaded by 5; step 50 finished 55; step 50 saved by 60 (blocking);
    step 70 finished 100; crash 100; restarted 115; step 50 loaded by 120; step 75 finished 195
    (3 min per step); step 75 saved by 200; finished 200. ``dense`` writes every step, otherwise
    only a few sampled steps.
    """
    w = dict(rank=0)
    out = [
        line("job_started", 0),
        line("cycle_started", 0, cycle=0),
        line("checkpoint_loaded", 5, step=25, tier="persistent", bytes=1, duration_s=5 * MIN, **w),
    ]
    first = range(26, 51) if dense else [26, 40, 50]
    out += [line("step", 5 + 2 * (s - 25), step=s, **w) for s in first]
    out.append(
        line(
            "checkpoint_saved",
            60,
            step=50,
            tier="persistent",
            bytes=1,
            blocked_s=5 * MIN,
            total_s=5 * MIN,
            **w,
        )
    )
    second = range(51, 71) if dense else [51, 63, 70]
    out += [line("step", 60 + 2 * (s - 50), step=s, **w) for s in second]
    out.append(line("cycle_ended", 100, cycle=0, cause="crash", timer=None, ranks=[0]))
    out.append(line("cycle_started", 115, cycle=1, attempt=1))
    w1 = dict(rank=0, attempt=1)
    out.append(
        line(
            "checkpoint_loaded", 120, step=50, tier="persistent", bytes=1, duration_s=5 * MIN, **w1
        )
    )
    third = range(51, 76) if dense else [51, 60, 75]
    out += [line("step", 120 + 3 * (s - 50), step=s, **w1) for s in third]
    out.append(
        line(
            "checkpoint_saved",
            200,
            step=75,
            tier="persistent",
            bytes=1,
            blocked_s=5 * MIN,
            total_s=5 * MIN,
            **w1,
        )
    )
    out.append(line("cycle_ended", 200, cycle=1, cause="success", timer=None, ranks=[], attempt=1))
    out.append(line("job_ended", 200, exit_code=0, reason="success", attempt=1))
    return out
