"""How far the job has got: the highest step in its goodput ledger, for the stop rules.

The "same failure again" rule must not stop a job that makes progress between its failures (a
rank killed three times in a week of training is not a deterministic failure). The ranks record
their steps and committed checkpoints in the job's ledger (``--goodput-dir``); the launcher
reads it once per failed cycle, never per step.
"""

from __future__ import annotations

import logging

from resiliency.goodput import GoodputError, LedgerReader

__all__ = ["highest_step"]

logger = logging.getLogger(__name__)

#: Events whose ``step`` field is progress the job keeps (a step finished, a step committed).
_PROGRESS_EVENTS = ("checkpoint_saved", "checkpoint_loaded")


def highest_step(directory: str | None) -> int | None:
    """The highest step the job's ledger records, or None when it records none.

    Args:
        directory: the ledger directory (``--goodput-dir``); None when the job keeps no ledger.

    Returns:
        The highest step of any ``step``, ``checkpoint_saved`` or ``checkpoint_loaded`` event;
        None without a ledger, with a ledger that records no step, or when it cannot be read
        (logged: the stop rules then judge by the failure's cause alone).
    """
    if directory is None:
        return None
    try:
        # A fresh reader each time: a failed cycle is rare, and the launcher keeps no copy of a
        # ledger that can hold a million steps.
        ledger = LedgerReader([directory]).update()
    except (GoodputError, OSError) as exc:
        logger.warning("cannot read the job's progress from the ledger in %s: %s", directory, exc)
        return None
    steps = [step for _, step, _ in ledger.steps]
    steps += [
        int(e.data["step"])
        for e in ledger.events
        if e.event in _PROGRESS_EVENTS and isinstance(e.data.get("step"), (int, float))
    ]
    return max(steps, default=None)
