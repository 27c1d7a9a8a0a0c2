"""The workers' process groups: what a stopped worker leaves behind, ended safely.

torch starts each worker in a new session, so the worker leads its own process group and its
children (data-loader workers, helpers) stay in it. They may outlive a worker that was killed.
After the workers are stopped, each recorded group still holding processes is sent ``SIGTERM``,
given a grace period, then ``SIGKILL``. A group is signalled only while it is still the one that
was recorded: if a process now holds the leader's pid with another start time, the pid was
reused (the kernel does not reuse a pid while a group of that number has members, so the old
group is empty) and the group is left alone.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

__all__ = ["WorkerProcessGroups"]

logger = logging.getLogger(__name__)


def _start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def _has_members(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerProcessGroups:
    """The process groups led by the workers of this node, by leader pid and start time."""

    def __init__(self) -> None:
        self._groups: dict[int, int | None] = {}

    def add(self, pid: int) -> None:
        """Record the group that worker ``pid`` leads."""
        self._groups[pid] = _start_ticks(pid)

    def _still_ours(self, pgid: int, ticks: int | None) -> bool:
        now = _start_ticks(pgid)
        return now is None or ticks is None or now == ticks

    def _signal(self, pgid: int, sig: signal.Signals) -> bool:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            logger.warning("cannot signal leftover process group %d: %s", pgid, exc)
            return False
        return True

    def end_leftovers(self, grace_s: float = 2.0) -> None:
        """SIGTERM every recorded group that still has processes; SIGKILL what is left after
        ``grace_s``; forget every group."""
        groups, self._groups = self._groups, {}
        live = [
            pgid
            for pgid, ticks in sorted(groups.items())
            if self._still_ours(pgid, ticks) and _has_members(pgid)
        ]
        live = [pgid for pgid in live if self._signal(pgid, signal.SIGTERM)]
        if not live:
            return
        deadline = time.monotonic() + grace_s
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            live = [pgid for pgid in live if _has_members(pgid)]
        for pgid in live:
            if self._signal(pgid, signal.SIGKILL):
                logger.warning(
                    "killed leftover processes of worker process group %d (still there %.0f s "
                    "after SIGTERM)",
                    pgid,
                    grace_s,
                )
