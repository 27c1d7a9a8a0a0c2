"""The timers of one worker process, and what the monitor has observed across workers.

Pure bookkeeping over ``time.monotonic()`` timestamps: the server feeds events in and asks which
timer, if any, has expired. Every open section is checked on its own, so an expired outer section
is never hidden by a fresh inner one; the most overdue expired timer is the one reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from resiliency.ft.timeouts import HeartbeatTimeouts, ObservedIntervals, SectionTimeouts

#: The least time a rank that closed its connection without 'bye' gets to exit.
EXIT_FLOOR_S = 30.0


@dataclass(frozen=True)
class ExpiredTimer:
    """A timer that ran out.

    Attributes:
        timer: ``"startup"``, ``"initial"``, ``"heartbeat"``, ``"section:<name>"``,
            ``"out_of_section"`` or ``"exit"``.
        elapsed: Seconds since the timer started.
        limit: The timeout, in seconds.
    """

    timer: str
    elapsed: float
    limit: float

    @property
    def overdue(self) -> float:
        """Seconds past the limit."""
        return self.elapsed - self.limit

    def describe(self) -> str:
        """Say in words which timer expired and by how much."""
        times = f"{self.elapsed:.1f} s, limit {self.limit:.1f} s ({self.overdue:.1f} s over)"
        if self.timer == "startup":
            return (
                "the worker has not called init_workload_monitoring() since it was started: "
                f"{times} (rank_startup_timeout)"
            )
        if self.timer == "initial":
            return f"no first heartbeat or section since init_workload_monitoring(): {times}"
        if self.timer == "heartbeat":
            return f"no heartbeat for {times}"
        if self.timer == "exit":
            return (
                "the rank closed its monitor connection without 'bye' (interpreter teardown) "
                f"and has not exited: {times}"
            )
        if self.timer == "out_of_section":
            return f"no section open for {times}"
        return f"section '{self.timer.removeprefix('section:')}' open for {times}"


@dataclass
class Observations:
    """The longest intervals seen so far in this job (kept across worker restarts)."""

    initial: float | None = None
    heartbeat: float | None = None
    sections: dict[str, float] = field(default_factory=dict)
    out_of_section: float | None = None

    def snapshot(self) -> ObservedIntervals:
        """Return an immutable copy."""
        return ObservedIntervals(
            self.initial, self.heartbeat, dict(self.sections), self.out_of_section
        )


def _longer(current: float | None, value: float) -> float:
    return value if current is None or value > current else current


class RankWatch:
    """Timers of one worker, from the moment the monitor learns its pid.

    Until the rank connects (``init_workload_monitoring()``) only the startup timer runs, from
    ``armed_at``; from the connection to the first heartbeat or section the initial timer runs.

    Args:
        pid: The worker's pid.
        rank: Its global rank, if known.
        armed_at: When the startup timer starts (the worker's spawn, as the monitor learned it).
        observations: Where observed intervals are accumulated.
        startup_timeout: Limit from ``armed_at`` to the connection (None: no limit).
    """

    def __init__(
        self,
        pid: int | None,
        rank: int | None,
        armed_at: float,
        observations: Observations,
        *,
        startup_timeout: float | None = None,
    ) -> None:
        self.pid = pid
        self.rank = rank
        self.armed_at = armed_at
        self.startup_timeout = startup_timeout
        self.connected_at: float | None = None
        self._obs = observations
        self.progressed = False
        self.last_heartbeat: float | None = None
        # Insertion order is opening order; values are start times.
        self.open_sections: dict[str, float] = {}
        self.used_sections = False
        self.last_section_end: float | None = None
        # The client registered its stack-dump handler ('dump_ready'): the dump signal is safe.
        self.dump_ready = False
        # Set once the rank closed its connection without 'bye': (since, limit) of the exit timer.
        self.exiting: tuple[float, float] | None = None

    def status(self, now: float) -> dict[str, Any]:
        """Heartbeat age and innermost open section, for the launcher's status view."""
        last = self.last_heartbeat
        sections = list(self.open_sections)
        return {
            "hb_age": None if last is None else max(0.0, now - last),
            "section": sections[-1] if sections else None,
        }

    def on_connect(self, ts: float) -> None:
        """Record that the rank connected (``init_workload_monitoring()``) at ``ts``."""
        if self.connected_at is None:
            self.connected_at = ts
        self.exiting = None

    def on_disconnect(self, ts: float, hb: HeartbeatTimeouts, sections: SectionTimeouts) -> float:
        """Record that the live rank closed its connection without 'bye' at ``ts``.

        A closed connection carries no heartbeat or section event, so every progress timer would
        expire however healthy the rank's exit is (a Python interpreter tearing down torch takes
        seconds). From now on one ``exit`` timer runs instead, as long as the longest progress
        timer that was running and never shorter than :data:`EXIT_FLOOR_S`: a teardown that
        hangs is still found. Teardown unregisters faulthandler, after which the dump signal's
        default action ends the process: no dump signal is sent from now on.

        Returns:
            The exit timer's limit, in seconds.
        """
        limits = [limit for _, _, limit in self._armed(hb, sections)]
        limit = max([EXIT_FLOOR_S, *limits])
        self.exiting = (ts, limit)
        self.dump_ready = False
        return limit

    def arm_startup(self, limit: float) -> bool:
        """Enforce the startup timer from now on, still counted from ``armed_at``.

        Returns:
            False when it was already armed, or the rank already connected.
        """
        if self.connected_at is not None or self.startup_timeout is not None:
            return False
        self.startup_timeout = limit
        return True

    def _progress(self, ts: float) -> None:
        if not self.progressed:
            self.progressed = True
            start = self.armed_at if self.connected_at is None else self.connected_at
            self._obs.initial = _longer(self._obs.initial, max(0.0, ts - start))

    def on_heartbeat(self, ts: float) -> None:
        """Record a heartbeat sent at ``ts``."""
        self._progress(ts)
        if self.last_heartbeat is not None:
            self._obs.heartbeat = _longer(self._obs.heartbeat, max(0.0, ts - self.last_heartbeat))
        self.last_heartbeat = ts if self.last_heartbeat is None else max(ts, self.last_heartbeat)

    def on_section_start(self, name: str, ts: float) -> bool:
        """Record that section ``name`` opened at ``ts``.

        Returns:
            False when it was already open (its original start time is kept).
        """
        self._progress(ts)
        if name in self.open_sections:
            return False
        if not self.open_sections and self.last_section_end is not None:
            gap = max(0.0, ts - self.last_section_end)
            self._obs.out_of_section = _longer(self._obs.out_of_section, gap)
        self.open_sections[name] = ts
        self.used_sections = True
        return True

    def on_section_end(self, name: str, ts: float) -> bool:
        """Record that section ``name`` closed at ``ts``.

        Returns:
            False when it was not open.
        """
        start = self.open_sections.pop(name, None)
        if start is None:
            return False
        duration = max(0.0, ts - start)
        self._obs.sections[name] = _longer(self._obs.sections.get(name), duration)
        if not self.open_sections:
            self.last_section_end = ts
        return True

    def on_end_all(self, ts: float) -> None:
        """Record that every open section closed at ``ts``."""
        for name in list(self.open_sections):
            self.on_section_end(name, ts)

    def _armed(
        self, hb: HeartbeatTimeouts, sections: SectionTimeouts
    ) -> list[tuple[str, float, float]]:
        """Every running timer as (name, start time, limit)."""
        if self.exiting is not None:
            return [("exit", *self.exiting)]
        timers = []
        if not self.progressed:
            if self.connected_at is None:
                if self.startup_timeout is not None:
                    timers.append(("startup", self.armed_at, self.startup_timeout))
            elif hb.initial is not None:
                timers.append(("initial", self.connected_at, hb.initial))
            return timers
        if self.last_heartbeat is not None and hb.subsequent is not None:
            timers.append(("heartbeat", self.last_heartbeat, hb.subsequent))
        for name, start in self.open_sections.items():
            limit = sections.limit_for(name)
            if limit is not None:
                timers.append((f"section:{name}", start, limit))
        if (
            self.used_sections
            and not self.open_sections
            and self.last_section_end is not None
            and sections.out_of_section is not None
        ):
            timers.append(("out_of_section", self.last_section_end, sections.out_of_section))
        return timers

    def expired(
        self, now: float, hb: HeartbeatTimeouts, sections: SectionTimeouts
    ) -> ExpiredTimer | None:
        """Return the most overdue expired timer, or None when every timer is within its limit.

        Args:
            now: The current ``time.monotonic()``.
            hb: The heartbeat timeouts in effect.
            sections: The section timeouts in effect.

        Returns:
            The expired timer that is furthest past its limit.
        """
        worst: ExpiredTimer | None = None
        for name, start, limit in self._armed(hb, sections):
            elapsed = now - start
            if elapsed > limit and (worst is None or elapsed - limit > worst.overdue):
                worst = ExpiredTimer(name, elapsed, limit)
        return worst

    def next_deadline(self, hb: HeartbeatTimeouts, sections: SectionTimeouts) -> float | None:
        """Return the earliest time at which a running timer expires, or None if none runs."""
        deadlines = [start + limit for _, start, limit in self._armed(hb, sections)]
        return min(deadlines) if deadlines else None
