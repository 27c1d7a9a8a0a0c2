"""What one restart cycle of a node's workers has seen so far.

The agent fills it in; the job-wide hang verdict (:mod:`resiliency.launcher._job_verdict`) reads
the cycle's ranks and asks its diagnosis for stacks.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from resiliency.ft import MonitorEvent
from resiliency.launcher._diagnosis import HangDiagnosis
from resiliency.launcher._failure_evidence import error_text, oom_kill_count, signal_name
from resiliency.launcher.verdict import HangVerdict

__all__ = ["Cycle"]

logger = logging.getLogger(__name__)

_STOP_SIGNALS = (-signal.SIGTERM, -signal.SIGKILL)


@dataclass
class Cycle:
    """What happened since the workers were last (re)started.

    Attributes:
        diagnosis: the hangs and stack dumps of this cycle.
        pids: local rank -> worker pid.
        ranks: local rank -> global rank.
        causes: why the cycle failed, root cause first.
        connected: local ranks whose worker is connected to its monitor.
        shutdown: a rank's ShutdownWorkload request, if any.
        exclude: a rank's ExcludeThisNode request, if any.
        hang_verdict: the cycle's hang verdict (the job-wide one when there is one).
        oom_at_start: the cgroup's OOM-kill count when the cycle started (None: unreadable).
        signalled: local ranks the launcher itself stopped while they ran (torch's context
            after another rank failed, or a restart), and when (monotonic seconds).
        dead_monitors: local ranks whose rank monitor died in this cycle.
        exits_seen: worker pids whose exit already woke the monitoring loop early.
    """

    diagnosis: HangDiagnosis
    pids: dict[int, int] = field(default_factory=dict)
    ranks: dict[int, int] = field(default_factory=dict)
    causes: list[str] = field(default_factory=list)
    connected: set[int] = field(default_factory=set)
    shutdown: MonitorEvent | None = None
    exclude: MonitorEvent | None = None
    hang_verdict: HangVerdict | None = None
    oom_at_start: int | None = field(default_factory=oom_kill_count)
    signalled: dict[int, float] = field(default_factory=dict)
    dead_monitors: list[int] = field(default_factory=list)
    exits_seen: set[int] = field(default_factory=set)

    def monitor_died(self, local_rank: int, cause: str) -> None:
        """The rank monitor of ``local_rank`` died: a cause of the cycle's failure."""
        self.dead_monitors.append(local_rank)
        self.causes.append(cause)

    def dead_monitor_ranks(self) -> tuple[int, ...]:
        """The global ranks whose monitor died."""
        return tuple(sorted(self.ranks[lr] for lr in set(self.dead_monitors) if lr in self.ranks))

    def note_signalled(self, local_ranks: set[int]) -> None:
        """The launcher is about to signal these running local ranks (the first time counts)."""
        now = time.monotonic()
        for local_rank in local_ranks:
            self.signalled.setdefault(local_rank, now)

    def signalled_ranks(self) -> frozenset[int]:
        """The global ranks the launcher signalled while they ran."""
        return frozenset(self.ranks[lr] for lr in self.signalled if lr in self.ranks)

    def note_failures(self, failures: Mapping[int, ProcessFailure]) -> None:
        """Log each failed worker once and add it to the causes, root cause first.

        A rank reported hung is left out: its hang is its cause, not its monitor's signal.

        Args:
            failures: torch's failures of this node's workers, by global rank.
        """
        # Root cause first: torch stops the surviving ranks with SIGTERM once one rank fails.
        ordered = sorted(
            failures.items(), key=lambda item: (item[1].exitcode in _STOP_SIGNALS, item[0])
        )
        for global_rank, failure in ordered:
            local_rank = failure.local_rank
            if local_rank in self.diagnosis.hangs:
                continue
            if failure.exitcode < 0:
                how = f"was killed by signal {signal_name(-failure.exitcode)}"
            else:
                how = f"exited with code {failure.exitcode}"
            message = f": {text}" if (text := error_text(failure)) else ""
            who = f"rank {global_rank} (local rank {local_rank}, pid {failure.pid})"
            cause = f"{who} {how}{message}"
            if cause not in self.causes:
                stopped = failure.exitcode in _STOP_SIGNALS and self.causes
                logger.log(logging.WARNING if stopped else logging.ERROR, "%s", cause)
                self.causes.append(cause)
