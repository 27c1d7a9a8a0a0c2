"""From ledger events to a partition of the job's wall time (the calculator's first half).

The job's time ``[start, end)`` is cut into *base* intervals that cover it without overlap:

* ``work``: between two progress marks of one cycle (a checkpoint loaded at step L, a step
  event at step s): ``s - L`` steps, some of them later redone (lost);
* a category: start-up before the first progress of the first cycle, restart before the first
  progress of a later cycle and after a failure, lost progress between the last mark and a
  failure, idle for the rest.

*Overlays* take their time out of whatever base interval they cross: checkpoint loading
(``duration_s`` before ``checkpoint_loaded``), the blocking part of a save (``blocked_s`` from the
save's start), and hang detection (from ``timeout_s + latency_s`` before ``hang_detected``).
Steps are sampled: a work interval stands for every step between two marks, at their average
duration. An ``inprocess_restart`` event (the same processes called the training function
again) starts a cycle too; the cycle before it failed ``duration_s`` earlier.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from dataclasses import dataclass, field

from resiliency.goodput.ledger import Event, Ledger

# Overlay categories, highest priority first where two overlap.
OVERLAY_PRIORITY = {"loading": 3, "saving": 2, "hang": 1}
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
LOAD = -1  # third item of a progress mark that is a checkpoint load (steps carry the attempt)


@dataclass
class Base:
    """One interval that is not work between two progress marks: a category.

    ``implicit`` marks a cycle's first step event with no checkpoint load before it: the interval
    before it holds one step of work, at most one ideal step of it.
    """

    start: float
    end: float
    category: str
    lost: int = 0
    implicit: bool = False


@dataclass
class Work:
    """Work intervals between consecutive progress marks, as parallel lists (there can be a
    million): ``start``/``end`` times, ``eff`` (seconds not covered by an overlay), ``n`` steps and
    ``lost`` of them redone later. Sorted by time, not overlapping."""

    start: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    eff: list[float] = field(default_factory=list)
    n: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)

    def add(self, start: float, end: float, n: int, lost: int) -> None:
        self.start.append(start)
        self.end.append(end)
        self.eff.append(end - start)
        self.n.append(n)
        self.lost.append(lost)


@dataclass
class Cycle:
    """One cycle (the workers from one start to their stop)."""

    number: int
    start: float
    end: float
    cause: str | None = None
    timer: str | None = None
    restore_step: int | None = None
    last_step: int | None = None
    failure_time: float | None = None
    hang: tuple[float, float] | None = None
    inprocess: str | None = None  # the cause of the in-process restart that ended it


@dataclass
class Timeline:
    """Base intervals, merged overlays and cycles of a ledger."""

    start: float
    end: float
    bases: list[Base] = field(default_factory=list)
    overlays: list[tuple[float, float, str]] = field(default_factory=list)
    cycles: list[Cycle] = field(default_factory=list)
    initial_step: int | None = None
    final_step: int | None = None
    saves: list[tuple[float, float, int]] = field(default_factory=list)
    loads: list[tuple[float, float, int]] = field(default_factory=list)
    work: Work = field(default_factory=Work)
    base_ends: list[float] = field(default_factory=list)
    effective: list[float] | None = None
    steps: list[tuple[float, int, int]] = field(default_factory=list)
    progress_from_saves: bool = False


def progress_steps(ledger: Ledger) -> tuple[list[tuple[float, int, int]], bool]:
    """The ``(time, step, attempt)`` progress marks of a ledger, and whether they are saves.

    The step events when there are any. Without them (a loop that never calls
    ``get_recorder().step()``), every committed checkpoint is a progress mark: its step was
    finished when its save began (the ``checkpoint_save_started`` time, else the commit time less
    the save's duration). One mark per step and attempt, the earliest.
    """
    if ledger.steps:
        return ledger.steps, False
    starts: dict[tuple[int, str, int], float] = {}
    marks: dict[tuple[int, int], float] = {}
    for ev in ledger.events:
        data = ev.data
        if ev.event == "checkpoint_save_started":
            starts[(int(data["step"]), str(data["tier"]), ev.attempt)] = ev.time
        elif ev.event == "checkpoint_saved":
            step = int(data["step"])
            begin = starts.pop((step, str(data["tier"]), ev.attempt), None)
            if begin is None:
                begin = ev.time - float(data["total_s"] or data["blocked_s"])
            key = (step, ev.attempt)
            marks[key] = min(begin, marks.get(key, begin))
    steps = sorted((when, step, attempt) for (step, attempt), when in marks.items())
    return steps, bool(steps)


def _cycle_starts(
    ledger: Ledger, steps: list[tuple[float, int, int]], step_times: list[float], start: float
) -> list[tuple[float, int]]:
    """Start time and number of each of the job's cycles.

    Every node's launcher numbers its own cycles, and a node that was replaced starts again
    from 0, so the job's cycles are cut from the nodes' ``cycle_started`` events by time.
    Without launcher events (torchrun), a rank changing its restart count (``attempt``)
    marks a start instead. See `_join_starts`. Job cycles are numbered in order.
    """
    node_starts = [(ev.time, ev.node) for ev in ledger.events if ev.event == "cycle_started"]
    if not node_starts:
        node_starts = _attempt_changes(ledger, steps)
    progress = list(step_times)  # sorted already: the few loads are inserted in order
    for when in [ev.time for ev in ledger.events if ev.event == "checkpoint_loaded"]:
        bisect.insort(progress, when)
    starts = _join_starts(node_starts, progress)
    # An in-process restart starts a new cycle in the same processes (no cycle_started).
    inprocess = [ev.time for ev in ledger.events if ev.event == "inprocess_restart"]
    if inprocess:
        starts = sorted({*(starts or [start]), *inprocess})
    if not starts:
        return [(start, 0)]
    return [(start, 0), *((when, i + 1) for i, when in enumerate(starts[1:]))]


def _attempt_changes(
    ledger: Ledger, steps: list[tuple[float, int, int]]
) -> list[tuple[float, str]]:
    """``(time, rank)`` where a rank first writes under a new restart count (its node's
    launcher restarted it); the ledger's first worker event counts as the first start.
    Steps are rank 0's."""
    marks = [
        (ev.time, str(ev.data["rank"]), ev.attempt)
        for ev in ledger.events
        if ev.data.get("rank") is not None
    ]
    marks += [(when, "0", attempt) for when, _, attempt in steps]
    marks.sort(key=_FIRST)
    last: dict[str, int] = {}
    changes: list[tuple[float, str]] = []
    for when, rank, attempt in marks:
        if not changes or (rank in last and last[rank] != attempt):
            changes.append((when, rank))
        last[rank] = attempt
    return changes


def _join_starts(node_starts: list[tuple[float, str]], progress: list[float]) -> list[float]:
    """The job's cycle starts from the nodes' starts: a node's start opens a new job cycle once
    progress (a step or a load) was made since the current one opened, or when that node
    already started in it; otherwise it joins it (the other nodes of the same restart)."""
    starts: list[float] = []
    nodes: set[str] = set()
    for when, node in node_starts:
        if starts:
            moved = bisect.bisect_left(progress, when) > bisect.bisect_right(progress, starts[-1])
            if not moved and node not in nodes:
                nodes.add(node)
                continue
        starts.append(when)
        nodes = {node}
    return starts


def _merge_overlays(raw: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Non-overlapping labelled intervals; where overlays overlap, the higher priority wins."""
    points: list[tuple[float, int, int]] = []
    for index, (a, b, _) in enumerate(raw):
        if b > a:
            points.append((a, 1, index))
            points.append((b, 0, index))
    points.sort()
    active: list[tuple[int, int]] = []  # (-priority, index), lazily cleaned
    ended: set[int] = set()
    out: list[tuple[float, float, str]] = []
    prev: float | None = None
    for pos, kind, index in points:
        while active and active[0][1] in ended:
            heapq.heappop(active)
        if prev is not None and active and pos > prev:
            category = raw[active[0][1]][2]
            if out and out[-1][1] == prev and out[-1][2] == category:
                out[-1] = (out[-1][0], pos, category)
            else:
                out.append((prev, pos, category))
        if kind == 1:
            heapq.heappush(active, (-OVERLAY_PRIORITY[raw[index][2]], index))
        else:
            ended.add(index)
        prev = pos
    return out


def _cycles(ledger: Ledger, starts: list[tuple[float, int]], end: float) -> list[Cycle]:
    cycles = [
        Cycle(number, when, starts[i + 1][0] if i + 1 < len(starts) else end)
        for i, (when, number) in enumerate(starts)
    ]
    index = 0
    for ev in ledger.events:
        while index + 1 < len(cycles) and ev.time >= cycles[index + 1].start:
            index += 1
        cycle = cycles[index]
        if ev.event == "cycle_ended" and ev.data["cause"] != "success":
            if cycle.failure_time is None or ev.time < cycle.failure_time:
                cycle.failure_time = ev.time
                cycle.cause = ev.data["cause"]
                cycle.timer = ev.data.get("timer")
        elif ev.event == "cycle_ended" and cycle.cause is None:
            cycle.cause = "success"
        elif ev.event == "inprocess_restart" and index > 0 and cycle.start == ev.time:
            _inprocess_failure(cycles[index - 1], ev)
        elif ev.event == "hang_detected" and cycle.hang is None:
            cycle.hang = _hang_span(ev)
            cycle.timer = cycle.timer or ev.data.get("timer")
    return cycles


def _inprocess_failure(cycle: Cycle, ev: Event) -> None:
    """``cycle`` ended in an in-process restart that took ``duration_s`` up to ``ev``."""
    cause = str(ev.data["cause"])
    when = max(ev.time - float(ev.data["duration_s"]), cycle.start)
    if cycle.failure_time is None or when < cycle.failure_time:
        cycle.failure_time = when
        cycle.cause = "hang" if cause == "hang" else "crash"
        cycle.inprocess = cause
    timeout = ev.data.get("timeout_s")
    if cause == "hang" and timeout is not None and cycle.hang is None:
        # Detection, as for hang_detected: from the last progress (at most the timeout before).
        cycle.hang = (when - float(timeout), when)


def _hang_span(ev: Event) -> tuple[float, float]:
    timeout = ev.data.get("timeout_s") or 0.0
    return (ev.time - float(ev.data["latency_s"]) - float(timeout), ev.time)


def build_timeline(ledger: Ledger) -> Timeline:
    """Cut the ledger's time into base intervals and overlays (see the module docstring)."""
    steps, from_saves = progress_steps(ledger)
    times = [ev.time for ev in ledger.events[:1]] + [s[0] for s in steps[:1]]
    if not times:
        return Timeline(0.0, 0.0)
    start = min(times)
    end = max([ev.time for ev in ledger.events[-1:]] + [s[0] for s in steps[-1:]])
    timeline = Timeline(start, end, steps=steps, progress_from_saves=from_saves)
    step_times = list(map(_FIRST, steps))
    starts = _cycle_starts(ledger, steps, step_times, start)
    timeline.cycles = cycles = _cycles(ledger, starts, end)

    # Progress marks per cycle: (time, step, LOAD) for loads, (time, step, attempt) for steps.
    loads: list[list[tuple[float, int, int]]] = [[] for _ in cycles]
    raw: list[tuple[float, float, str]] = []
    save_starts: dict[tuple[int, str], float] = {}
    index = 0
    for ev in ledger.events:
        while index + 1 < len(cycles) and ev.time >= cycles[index + 1].start:
            index += 1
        data = ev.data
        if ev.event == "checkpoint_loaded":
            loads[index].append((ev.time, int(data["step"]), LOAD))
            raw.append((ev.time - float(data["duration_s"]), ev.time, "loading"))
            timeline.loads.append((raw[-1][0], ev.time, int(data["step"])))
        elif ev.event == "checkpoint_save_started":
            save_starts[(int(data["step"]), str(data["tier"]))] = ev.time
        elif ev.event == "checkpoint_saved":
            begin = save_starts.pop((int(data["step"]), str(data["tier"])), None)
            if begin is None:
                begin = ev.time - float(data["total_s"] or data["blocked_s"])
            raw.append((begin, begin + float(data["blocked_s"]), "saving"))
            timeline.saves.append((begin, ev.time, int(data["step"])))
    bounds = [0] + [bisect.bisect_left(step_times, c.start) for c in cycles[1:]]
    bounds.append(len(step_times))
    marks: list[list[tuple[float, int, int]]] = []
    for i, cycle_loads in enumerate(loads):
        cycle_marks = steps[bounds[i] : bounds[i + 1]]
        for load in cycle_loads:  # few: inserted in order, not a sort of a million marks
            bisect.insort(cycle_marks, load)
        marks.append(cycle_marks)
    for cycle, cycle_marks in zip(cycles, marks, strict=True):
        if cycle_marks:
            _, first_step, kind = cycle_marks[0]
            cycle.restore_step = first_step if kind == LOAD else first_step - 1
            cycle.last_step = cycle_marks[-1][1]
        if cycle.hang is not None:
            last = cycle_marks[-1][0] if cycle_marks else cycle.start
            hang_start = min(max(cycle.hang[0], last), cycle.hang[1])
            cycle.hang = (hang_start, cycle.hang[1])
            raw.append((hang_start, cycle.hang[1], "hang"))
            if cycle.failure_time is None or hang_start < cycle.failure_time:
                cycle.failure_time = hang_start
                cycle.cause = "hang"
    timeline.overlays = [
        (max(a, start), min(b, end), c) for a, b, c in _merge_overlays(raw) if b > start and a < end
    ]

    # Restore points of later cycles decide which steps were redone.
    future_restore: list[float] = [float("inf")] * len(cycles)
    lowest = float("inf")
    for i in range(len(cycles) - 1, -1, -1):
        future_restore[i] = lowest
        if cycles[i].restore_step is not None:
            lowest = min(lowest, float(cycles[i].restore_step or 0))
    restored = [c.restore_step for c in cycles if c.restore_step is not None]
    timeline.initial_step = restored[0] if restored else None
    timeline.final_step = next((c.last_step for c in reversed(cycles) if c.last_step), None)

    for i, (cycle, cycle_marks) in enumerate(zip(cycles, marks, strict=True)):
        _cut_cycle(
            timeline, cycle, cycle_marks, index=i, count=len(cycles), future=future_restore[i]
        )
    timeline.base_ends = [b.end for b in timeline.bases]
    _subtract_overlays(timeline.work, timeline.overlays)
    return timeline


def _subtract_overlays(work: Work, overlays: list[tuple[float, float, str]]) -> None:
    """Take the overlays' time out of the work intervals they cross."""
    count = len(work.start)
    for a, b, _ in overlays:
        i = bisect.bisect_right(work.end, a)
        while i < count and work.start[i] < b:
            overlap = min(b, work.end[i]) - max(a, work.start[i])
            if overlap > 0:
                work.eff[i] = max(work.eff[i] - overlap, 0.0)
            i += 1


def _cut_cycle(
    timeline: Timeline,
    cycle: Cycle,
    marks: list[tuple[float, int, int]],
    *,
    index: int,
    count: int,
    future: float,
) -> None:
    """Append the base and work intervals of one cycle."""
    bases, work = timeline.bases, timeline.work
    before = "startup" if index == 0 else "restart"
    failure = cycle.failure_time
    if failure is None and index + 1 < count:
        failure = marks[-1][0] if marks else cycle.start  # restarted with no failure recorded
    stop = cycle.end if failure is None else min(max(failure, cycle.start), cycle.end)
    times = list(map(_FIRST, marks))
    k = bisect.bisect_right(times, stop)
    if k == 0:
        bases.append(Base(cycle.start, stop, before))
    else:
        first_time, first_step, kind = marks[0]
        implicit = kind != LOAD
        lost_first = int(implicit and first_step > future)
        bases.append(Base(cycle.start, first_time, before, implicit=implicit, lost=lost_first))
        if k < len(marks):  # (a million marks: no copies when every one is kept)
            marks, times = marks[:k], times[:k]
        steps = list(map(_SECOND, marks))
        # map() stops at its shortest input: islice(x, 1) and x pair each mark with the next.
        n = list(map(operator.sub, itertools.islice(steps, 1, None), steps))
        if n and min(n) > 0:  # steps only go up: the fast way
            lost = _lost_steps(steps, n, future)
            work.start.extend(times[:-1])
            work.end.extend(times[1:])
            work.eff.extend(map(operator.sub, itertools.islice(times, 1, None), times))
            work.n.extend(n)
            work.lost.extend(lost)
        else:
            for i, steps_done in enumerate(n):
                if steps_done > 0:
                    lost_i = steps[i + 1] - max(steps[i], future) if future < steps[i + 1] else 0
                    work.add(times[i], times[i + 1], steps_done, int(lost_i))
                else:
                    bases.append(Base(times[i], times[i + 1], "idle"))
        # After the last mark: steps not sampled, redone if a later cycle restores from before.
        tail = "lost" if failure is not None and future <= steps[-1] else "idle"
        bases.append(Base(times[-1], stop, tail))
    if stop < cycle.end:
        bases.append(Base(stop, cycle.end, "restart" if index + 1 < count else "idle"))


def _lost_steps(steps: list[int], n: list[int], future: float) -> list[int]:
    """Steps of each interval redone later (those above ``future``); ``steps`` only go up."""
    if future >= steps[-1]:
        return [0] * len(n)
    first = max(bisect.bisect_right(steps, future) - 1, 0)
    partial = int(steps[first + 1] - max(steps[first], future))
    return [0] * first + [partial] + n[first + 1 :]
