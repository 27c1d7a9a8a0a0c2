"""What one restart cycle of a node's workers has seen so far.

The agent fills it in; the job-wide hang verdict (:mod:`resiliency.launcher.job_verdict`) reads
the cycle's ranks and asks its diagnosis for stacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resiliency.ft import MonitorEvent
from resiliency.launcher.diagnosis import HangDiagnosis
from resiliency.launcher.failure_evidence import oom_kill_count
from resiliency.launcher.verdict import HangVerdict

__all__ = ["Cycle"]


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
