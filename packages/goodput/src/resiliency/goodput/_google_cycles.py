"""Google log records to this package's events: per-node starts and ends grouped into cycles.

Every node of a Google job writes its own ``job_started`` and ``job_terminated``; a restart of a
112-node job is 112 of each, interleaved across nodes, in any order in the file. Taken in time
order, a node's start opens a new cycle when that node already started in the current cycle, or
when some node of the current cycle already terminated (a restart follows the end of a cycle);
otherwise it joins the current cycle (the other nodes of the same start). An end belongs to the
cycle in which its node started last. Loads and saves belong to the cycle open at their time.

Per cycle, the events are those of one job run: one ``cycle_started`` at its first node start,
one ``cycle_ended`` (a crash at the first node end; the last cycle's end, at its last node end, a
success), one ``checkpoint_loaded`` and one ``checkpoint_saved`` per step (when its last node
finished: the checkpoint is whole then). A saved checkpoint is also the progress mark of its
step (Google's log has no step events), and a cycle that loads nothing starts from step 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resiliency.goodput._google import GoogleRecord

# (time, event type, data, source file, line) of one converted event.
Converted = tuple[float, str, dict[str, Any], str, int]


@dataclass
class _Cycle:
    """The records of one cycle (one start of the whole job)."""

    start: GoogleRecord
    nodes: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    ends: list[GoogleRecord] = field(default_factory=list)
    loads: dict[int, GoogleRecord] = field(default_factory=dict)
    saves: dict[int, GoogleRecord] = field(default_factory=dict)


def group_cycles(records: list[GoogleRecord]) -> tuple[list[_Cycle], list[GoogleRecord]]:
    """The cycles of the records (in time order), and the job-level records (user_*)."""
    cycles: list[_Cycle] = []
    job_level: list[GoogleRecord] = []
    for record in sorted(records, key=lambda r: r.order):
        kind = record.kind
        current = cycles[-1] if cycles else None
        if kind in ("user_scheduled", "user_terminated"):
            job_level.append(record)
        elif kind == "job_started":
            if current is None or record.node in current.nodes or current.ended:
                current = _Cycle(record)
                cycles.append(current)
            current.nodes.add(record.node)
        elif current is None:
            continue  # an end, load or save before any start: nothing to attach it to
        elif kind == "job_terminated":
            owner = _owner(cycles, record.node)
            owner.ended.add(record.node)
            owner.ends.append(record)
        elif record.step is not None:
            # The step's checkpoint is whole when its last node is done: keep the latest.
            table = current.loads if kind == "checkpoint_loaded" else current.saves
            table[record.step] = record
    return cycles, job_level


def _owner(cycles: list[_Cycle], node: str) -> _Cycle:
    """The cycle a node's end belongs to: the latest one the node started in."""
    for cycle in reversed(cycles):
        if node in cycle.nodes:
            return cycle
    return cycles[-1]


def _data(record: GoogleRecord, event: str, attempt: int, **fields: Any) -> dict[str, Any]:
    return {
        "job": record.job,
        "event": event,
        "node": record.node,
        "rank": None,
        "attempt": attempt,
        "google": True,
        **fields,
    }


def _event(record: GoogleRecord, event: str, attempt: int, **fields: Any) -> Converted:
    return (record.time, event, _data(record, event, attempt, **fields), record.source, record.line)


def _cycle_events(cycle: _Cycle, number: int, last: bool) -> tuple[list[Converted], list[Any]]:
    out: list[Converted] = []
    steps: list[tuple[float, int, int]] = []
    # The job cycles are numbered here: one node name for all starts keeps the timeline from
    # joining two of them.
    out.append(_event(cycle.start, "cycle_started", number, cycle=number, node="job"))
    if not cycle.loads:  # no load: the cycle starts from scratch (zero-length, marked)
        fields = {"step": 0, "tier": "persistent", "bytes": 0, "duration_s": 0.0}
        out.append(_event(cycle.start, "checkpoint_loaded", number, synthetic=True, **fields))
    for step, record in sorted(cycle.loads.items()):
        fields = {"step": step, "tier": "persistent", "bytes": 0, "duration_s": 0.0}
        out.append(_event(record, "checkpoint_loaded", number, **fields))
    for step, record in sorted(cycle.saves.items()):
        fields = {"step": step, "tier": "persistent", "bytes": 0, "blocked_s": 0.0, "total_s": 0.0}
        out.append(_event(record, "checkpoint_saved", number, **fields))
        steps.append((record.time, step, number))
    if cycle.ends:
        end = max(cycle.ends, key=lambda r: r.order) if last else cycle.ends[0]
        cause = "success" if last else "crash"
        out.append(_event(end, "cycle_ended", number, cycle=number, cause=cause, ranks=[]))
    return out, steps


def convert(records: list[GoogleRecord]) -> tuple[list[Converted], list[tuple[float, int, int]]]:
    """This package's events and ``(time, step, attempt)`` progress marks of a Google log."""
    cycles, job_level = group_cycles(records)
    events: list[Converted] = []
    steps: list[tuple[float, int, int]] = []
    for number, cycle in enumerate(cycles):
        if number == 0:
            events.append(_event(cycle.start, "job_started", 0))
        cycle_out, cycle_steps = _cycle_events(cycle, number, last=number == len(cycles) - 1)
        events += cycle_out
        steps += cycle_steps
    last_attempt = max(len(cycles) - 1, 0)
    scheduled = [r for r in job_level if r.kind == "user_scheduled"]
    terminated = [r for r in job_level if r.kind == "user_terminated"]
    if scheduled:
        events.append(_event(scheduled[0], "job_scheduled", 0))
    if terminated:
        fields = {"exit_code": 0, "reason": "user_terminated"}
        events.append(_event(terminated[-1], "job_ended", last_attempt, **fields))
    return events, steps
