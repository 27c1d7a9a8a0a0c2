"""The records of the failure diagnosis: the classes, a rank's and a cycle's evidence, the verdict.

Plain data, no rules (the rules are :mod:`resiliency.launcher.failure_classes`, which exports
these under its own name).
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CycleEvidence", "FailureClass", "FailureVerdict", "RankEvidence"]


class FailureClass(str, enum.Enum):
    """The classes of the table above (the string is what the ledger records)."""

    CRASH = "crash"
    OOM = "oom"
    SIGNAL = "signal"
    NAN_INF = "nan_inf"
    HANG_COLLECTIVE = "hang_collective"
    HANG_IO = "hang_io"
    HANG_CHECKPOINT = "hang_checkpoint"
    HANG = "hang"
    GPU_HARDWARE = "gpu_hardware"
    PREEMPTION = "preemption"
    CONFIG = "config"
    NODE_HEALTH = "node_health"
    NODE_LOST = "node_lost"
    MONITOR = "monitor"
    UNKNOWN = "unknown"


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGKILL)
# A rank that raised one of these lost a peer in a collective: it waited, the peer failed.
_PEER_LOST_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Read error|"
    r"DistNetworkError|NCCL communicator was aborted|communicator was aborted",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RankEvidence:
    """What one failed (or hung) rank left behind.

    Attributes:
        rank: global rank.
        node: its node (group rank).
        exitcode: its exit code; negative: killed by that signal.
        exc_type: the exception type from its ``@record`` error file, if any.
        message: the exception message from the error file, if any.
        frame: its innermost frame when it hung (``name (file:line)``), None without a dump.
        frame_path: the full file name of that frame.
        timer: the timer that expired when it hung (``heartbeat``, ``section:<name>``).
        hung: it hung (its monitor reported it).
        stopped_by_launcher: the launcher signalled it while it still ran (True), did not
            (False), or kept no record (None).
    """

    rank: int
    node: int
    exitcode: int | None = None
    exc_type: str | None = None
    message: str | None = None
    frame: str | None = None
    frame_path: str | None = None
    timer: str | None = None
    hung: bool = False
    stopped_by_launcher: bool | None = None

    @property
    def signal_name(self) -> str | None:
        """The signal that killed it, by name (None when it exited)."""
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def stopped(self) -> bool:
        """Killed by SIGTERM or SIGKILL: possibly by the launcher, after another failure."""
        return self.exitcode is not None and -self.exitcode in _STOP_SIGNALS

    @property
    def peer_lost(self) -> bool:
        """It raised an error that says a peer of its collective went away."""
        text = f"{self.exc_type or ''}: {self.message or ''}"
        return self.exc_type is not None and bool(_PEER_LOST_RE.search(text))

    def error(self) -> str | None:
        """The exception as ``Type: message`` (None without an error file)."""
        if self.exc_type is None:
            return None
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type

    def to_json(self) -> dict[str, Any]:
        """The fields that carry evidence (None ones left out)."""
        keys = ("exitcode", "exc_type", "message", "frame", "timer")
        out: dict[str, Any] = {"rank": self.rank, "node": self.node}
        out.update({k: getattr(self, k) for k in keys if getattr(self, k) is not None})
        if self.signal_name is not None:
            out["signal"] = self.signal_name
        if self.stopped_by_launcher:
            out["stopped_by_launcher"] = True
        return out


@dataclass(frozen=True)
class CycleEvidence:
    """Everything one node knows about a failed cycle.

    Attributes:
        node: this node (group rank).
        attempt: the restart count of the cycle (0: the first attempt).
        ranks: the failed or hung ranks, by global rank (other nodes' hung ranks included when
            the job-wide hang verdict named them).
        hang_culprits: the hang verdict's culprit ranks (empty without a hang or a culprit).
        common_frame: the frame the waiting ranks were stuck at, if any (``name (file:line)``).
        oom_kills: processes the kernel's OOM killer killed in this node's cgroup this cycle.
        health: failed health checks of the node (``name: detail``).
        preempted: why the cycle counts as a preemption, if it does.
        preempted_nodes: the nodes that were preempted (empty: this node, when ``preempted``).
        lost_nodes: nodes of the round that gave no evidence (job-wide evidence only).
        dead_monitors: global ranks whose rank monitor died during the cycle.
    """

    node: int
    attempt: int
    ranks: Mapping[int, RankEvidence] = field(default_factory=dict)
    hang_culprits: tuple[int, ...] = ()
    common_frame: str | None = None
    oom_kills: int = 0
    health: tuple[str, ...] = ()
    preempted: str | None = None
    preempted_nodes: tuple[int, ...] = ()
    lost_nodes: tuple[int, ...] = ()
    dead_monitors: tuple[int, ...] = ()


@dataclass(frozen=True)
class FailureVerdict:
    """The class of a failed cycle, its culprits and the evidence it rests on.

    Attributes:
        cls: the failure class.
        culprit_ranks: global ranks to blame (sorted).
        culprit_nodes: their nodes (group ranks, sorted).
        cause: the cause in one line (``ValueError: bad batch at step 3``, a frame, a signal).
        rule: the rule of :data:`RULES` that matched.
        evidence: what the rule read, JSON-ready.
    """

    cls: FailureClass
    culprit_ranks: tuple[int, ...]
    culprit_nodes: tuple[int, ...]
    cause: str
    rule: str
    evidence: dict[str, Any]

    @property
    def signature(self) -> tuple[str, tuple[int, ...], str]:
        """What must repeat for a failure to count as the same one: class, culprits, cause."""
        return (self.cls.value, self.culprit_ranks, self.cause)

    def summary(self) -> str:
        """One line for the log."""
        who = ",".join(map(str, self.culprit_ranks)) or "-"
        nodes = ",".join(map(str, self.culprit_nodes)) or "-"
        return f"{self.cls.value} (ranks {who}, nodes {nodes}): {self.cause}"
