"""What one restart cycle of a node's workers has seen so far.

The agent fills it in; the job-wide hang verdict (:mod:`resiliency.launcher.job_verdict`) reads
the cycle's ranks and asks its diagnosis for stacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resiliency.ft import MonitorEvent
from resiliency.launcher.diagnosis import HangDiagnosis

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
    """

    diagnosis: HangDiagnosis
    pids: dict[int, int] = field(default_factory=dict)
    ranks: dict[int, int] = field(default_factory=dict)
    causes: list[str] = field(default_factory=list)
    connected: set[int] = field(default_factory=set)
    shutdown: MonitorEvent | None = None
    exclude: MonitorEvent | None = None
