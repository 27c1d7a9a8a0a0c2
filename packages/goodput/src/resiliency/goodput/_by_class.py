"""Restart and lost-progress time per failure class, from the launcher's ``diagnosis`` events.

Each failed cycle of the timeline takes the class of the first ``diagnosis`` event written while
it was the current cycle (the launcher writes it right after the cycle's ``cycle_ended``; with
several culprit nodes the first one counts). Its **lost progress** is the cycle's own
``lost_progress``; its **restart** time is the ``restart`` category (hang detection included)
from the cycle's failure to the next cycle's failure (or the end of the ledger), i.e. detecting
the failure and getting back to progress. A failed cycle without a diagnosis (a ledger written
before the launcher recorded them, or a failure the launcher did not diagnose) counts as
``unclassified``, so older ledgers give the same totals. A cycle ended by an in-process
restart (``inprocess_restart``) with no diagnosis takes ``inprocess_<cause>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from resiliency.goodput._timeline import Cycle
from resiliency.goodput.ledger import Event

#: The class of a failed cycle that has no ``diagnosis`` event.
UNCLASSIFIED = "unclassified"
#: The class of a cycle ended by an in-process restart: this prefix and its cause.
INPROCESS_PREFIX = "inprocess_"


@dataclass
class ClassRow:
    """One failure class: how many failed cycles, and the time they cost."""

    cls: str
    failures: int = 0
    restart_s: float = 0.0
    lost_progress_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "failures": self.failures,
            "restart_s": self.restart_s,
            "lost_progress_s": self.lost_progress_s,
        }


def _classes(events: Sequence[Event], cycles: Sequence[Cycle]) -> list[str | None]:
    """The class of each cycle's first diagnosis (None: none)."""
    found: list[str | None] = [None] * len(cycles)
    index = 0
    for ev in events:
        if not cycles:
            break
        while index + 1 < len(cycles) and ev.time >= cycles[index + 1].start:
            index += 1
        if ev.event == "diagnosis" and found[index] is None:
            found[index] = str(ev.data["cls"])
    return found


def by_class(
    events: Sequence[Event],
    cycles: Sequence[Cycle],
    lost: Sequence[float],
    restart_between: Callable[[float, float], float],
    end: float,
) -> list[ClassRow]:
    """Restart and lost-progress seconds per failure class, most costly first.

    Args:
        events: the ledger's events (time order).
        cycles: the timeline's cycles.
        lost: each cycle's lost-progress seconds.
        restart_between: the ``restart`` seconds of ``[lo, hi)``.
        end: the end of the ledger's time span.
    """
    rows: dict[str, ClassRow] = {}
    for i, (cycle, cls) in enumerate(zip(cycles, _classes(events, cycles), strict=True)):
        if cycle.cause in (None, "success"):
            continue
        name = cls or (INPROCESS_PREFIX + cycle.inprocess if cycle.inprocess else UNCLASSIFIED)
        row = rows.setdefault(name, ClassRow(name))
        row.failures += 1
        row.lost_progress_s += lost[i]
        lo = cycle.failure_time if cycle.failure_time is not None else cycle.end
        nxt = cycles[i + 1] if i + 1 < len(cycles) else None
        hi = end if nxt is None else (nxt.failure_time or nxt.end)
        if hi > lo:
            row.restart_s += restart_between(lo, hi)
    return sorted(rows.values(), key=lambda r: (-(r.restart_s + r.lost_progress_s), r.cls))
