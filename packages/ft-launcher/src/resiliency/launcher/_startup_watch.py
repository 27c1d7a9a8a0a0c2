"""Which workers are hang-watched before they connect, and one notice about those that are not.

Hang detection starts when a worker calls ``init_workload_monitoring()``. A plain ``torchrun``
script never does, and must run exactly as under torchrun, however long it runs: its monitors
never enforce ``rank_startup_timeout`` on it. That timer exists for a different case, a rank of a
script that *does* connect but hangs before it gets there (a stuck import, a stalled file
system). So it is armed on a node once any worker of the job has connected there: from then on
(this attempt and every restart) a worker that has not connected within ``rank_startup_timeout``
of its spawn is a hang. Until then, once the workers have run for a while without connecting,
the launcher says once which ranks are not hang-watched.
"""

from __future__ import annotations

import logging
import time

from resiliency.launcher._monitors import MonitorSet

__all__ = ["NOTICE_AFTER_S", "StartupWatch"]

logger = logging.getLogger(__name__)

#: How long workers run without connecting before the launcher says they are not hang-watched
#: (sooner when ``rank_startup_timeout`` is shorter).
NOTICE_AFTER_S = 60.0


class StartupWatch:
    """The node's memory of whether the job connects to its monitors, across restarts.

    Args:
        monitors: This node's rank monitors.
        startup_timeout: ``rank_startup_timeout`` (None: the startup timer is off anyway).
    """

    def __init__(self, monitors: MonitorSet, startup_timeout: float | None) -> None:
        self._monitors = monitors
        self._timeout = startup_timeout
        self._notice_after = min(NOTICE_AFTER_S, startup_timeout or NOTICE_AFTER_S)
        self.job_connects = False
        self._noticed = False
        self._started_at = time.monotonic()
        self._ranks: dict[int, int] = {}
        self._connected: set[int] = set()

    @property
    def watch_startup(self) -> bool:
        """Whether new workers get the startup timer from their spawn on."""
        return self.job_connects

    def cycle_started(self, ranks: dict[int, int]) -> None:
        """The workers were (re)started: local rank -> global rank."""
        self._started_at = time.monotonic()
        self._ranks = dict(ranks)
        self._connected = set()

    def connected(self, local_rank: int) -> None:
        """A worker connected to its monitor: the job uses hang detection."""
        self._connected.add(local_rank)
        if self.job_connects:
            return
        self.job_connects = True
        waiting = sorted(lr for lr in self._ranks if lr not in self._connected)
        if self._timeout is not None and waiting:
            logger.info(
                "rank %s connected to its monitor; %s must connect within "
                "rank_startup_timeout (%s s of spawn) or count as hung",
                self._ranks.get(local_rank, local_rank),
                _ranks_text([self._ranks[lr] for lr in waiting]),
                f"{self._timeout:g}",
            )
            self._monitors.arm_startup(waiting)

    def check(self) -> None:
        """Say once which ranks are not hang-watched (called from the agent's loop)."""
        if self.job_connects or self._noticed or not self._ranks:
            return
        running = time.monotonic() - self._started_at
        if running < self._notice_after:
            return
        self._noticed = True
        logger.warning(
            "%s have not called init_workload_monitoring() %s s after start: they are not "
            "hang-watched and run as under torchrun (a crash still restarts them; a hang does "
            "not). To watch them, report progress with RankMonitorClient heartbeats or sections "
            "(docs/coming_from_torchrun.md)",
            _ranks_text(sorted(self._ranks.values())),
            f"{running:.0f}",
        )


def _ranks_text(ranks: list[int]) -> str:
    noun = "rank" if len(ranks) == 1 else "ranks"
    return f"{noun} {','.join(str(r) for r in ranks)}"
