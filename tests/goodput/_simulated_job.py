"""A ledger of a long job with failures drawn from a known MTBF (for ``advise``).

The job trains at a fixed step time, saves every ``save_every`` steps (the save blocks for
``blocked_s`` and commits ``total_s`` after it began), and fails at the times of a renewal
process with exponential gaps of mean ``mtbf_s``. After a failure the launcher restarts the
workers ``restart_s`` later; they load the last committed checkpoint (``restore_s``) and go on
from its step. Step events are sampled (one every ``sample_s`` of training, plus the last step
before a failure), as the recorder samples them.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ._ledgers import line, write


def simulated_job(
    path: Path,
    *,
    mtbf_s: float,
    failures: int,
    seed: int = 0,
    step_s: float = 1.0,
    save_every: int = 600,
    blocked_s: float = 20.0,
    total_s: float = 30.0,
    restore_s: float = 40.0,
    restart_s: float = 60.0,
    sample_s: float = 60.0,
) -> Path:
    """Write the ledger to ``path``; the job ends (success) an MTBF after its last failure."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    minute = 1.0 / 60.0  # the line helper takes minutes

    def add(event: str, at: float, attempt: int, **fields: Any) -> None:
        out.append(line(event, at * minute, attempt=attempt, **fields))

    now, attempt, step, committed = 0.0, 0, 0, 0
    add("job_started", now, 0)
    next_failure = rng.expovariate(1.0 / mtbf_s)
    seen = 0
    while True:
        add("cycle_started", now, attempt, cycle=attempt)
        if attempt > 0:
            now += restore_s
            add(
                "checkpoint_loaded",
                now,
                attempt,
                rank=0,
                step=committed,
                tier="persistent",
                bytes=1,
                duration_s=restore_s,
            )
            step = committed
        last_sample = now
        pending: tuple[float, int] | None = None  # a save's commit time and step
        ends = seen == failures
        deadline = next_failure if not ends else now + mtbf_s
        while True:
            if pending is not None and pending[0] <= deadline and pending[0] <= now:
                committed = pending[1]
                pending = None
            if now + step_s > deadline:
                break
            now += step_s
            step += 1
            if now - last_sample >= sample_s:
                add("step", now, attempt, rank=0, step=step)
                last_sample = now
            if step % save_every == 0:
                start = now
                now += blocked_s
                if start + total_s <= deadline:
                    add(
                        "checkpoint_saved",
                        start + total_s,
                        attempt,
                        rank=0,
                        step=step,
                        tier="persistent",
                        bytes=1,
                        blocked_s=blocked_s,
                        total_s=total_s,
                    )
                    pending = (start + total_s, step)
                if now > deadline:
                    break
        if pending is not None and pending[0] <= deadline:
            committed = pending[1]
        if last_sample < now:
            add("step", now, attempt, rank=0, step=step)
        if ends:
            add("cycle_ended", deadline, attempt, cycle=attempt, cause="success", ranks=[])
            add("job_ended", deadline, attempt, exit_code=0, reason="success")
            break
        add("cycle_ended", deadline, attempt, cycle=attempt, cause="crash", ranks=[0])
        seen += 1
        now = deadline + restart_s
        attempt += 1
        next_failure = deadline + rng.expovariate(1.0 / mtbf_s)
        next_failure = max(next_failure, now + restore_s + step_s)
    out.sort(key=lambda x: x["time"])
    return write(path, out)
