"""What to do after a failed cycle: restart, restart without the culprit node, or stop.

The rules, tried in this order (each documented in docs/launcher.md, each configurable):

1. **configuration error on the first attempt** (class ``config`` in attempt 0): stop, exit 2
   (``USAGE``). The job never ran; a restart runs the same code with the same settings.
2. **the same failure again, without progress**: the last ``max_no_progress_cycles`` failed
   cycles (default 3, the name of NVIDIA's flag; 0: never) all have the same class, the same
   culprit ranks and the same cause (exception type and message, the hung frame, or the signal),
   and the job got no further in between: the highest step of its goodput ledger
   (:mod:`~resiliency.launcher._job_progress`) is the same at each of these failures. Without a
   ledger that records steps, only failures that repeat by nature count (an exception, a
   configuration error, a NaN): a kill, an OOM kill or a hang that recurs cannot be told from
   one that recurs while training progresses. Stop, exit 6 (``DIAGNOSED_STOP``).
3. **a restart storm**: more than ``restart_storm_restarts`` restarts within
   ``restart_storm_window`` seconds (0, the default: never): stop, exit 6.
4. **GPU hardware on this node** (class ``gpu_hardware``, this node a culprit): restart without
   this node: it leaves the job (exit 4, like ``ExcludeThisNode``); the others go on without it
   when ``--nnodes MIN:MAX`` allows.
5. otherwise: restart (``--max-restarts`` stays the upper bound).
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass

from resiliency.launcher.failure_classes import FailureClass, FailureVerdict

__all__ = ["Action", "StopDecision", "StopRules"]


#: The classification rules (``FailureVerdict.rule``) of failures that repeat by nature: the
#: same exception, configuration error or NaN again is the same failure even when the job's
#: progress is unknown. A kill, an OOM kill, a hang or a bare exit code is not.
_REPEAT_BY_NATURE = frozenset(
    {"exception", "exit 78 or import / config exception", "NaN or Inf loss"}
)


class Action(str, enum.Enum):
    """The decision (the string is what the ledger records)."""

    RESTART = "restart"
    RESTART_WITHOUT_NODE = "restart_without_node"
    STOP = "stop"


@dataclass(frozen=True)
class StopDecision:
    """A decision and the rule behind it.

    Attributes:
        action: restart, restart without the node, or stop.
        rule: ``config_first_attempt``, ``repeated``, ``restart_storm``, ``gpu_hardware`` or
            ``default``.
        reason: one line naming the cause (for the log and the launcher's last line).
    """

    action: Action
    rule: str
    reason: str


class StopRules:
    """The stop rules over this node's failed cycles (see the module docstring).

    Args:
        node: this node's group rank.
        max_no_progress_cycles: how many consecutive identical failures stop the job (0: never).
        storm_restarts: how many restarts within ``storm_window`` stop the job (0: never).
        storm_window: the storm's window, in seconds.
    """

    def __init__(
        self,
        node: int,
        max_no_progress_cycles: int,
        storm_restarts: int,
        storm_window: float,
    ) -> None:
        self._node = node
        self._repeat = max_no_progress_cycles
        self._storm = storm_restarts
        self._window = storm_window
        self._history: list[tuple[FailureVerdict, int | None]] = []
        self._restarts: deque[float] = deque()

    def set_node(self, node: int) -> None:
        """This node's group rank in the current round (it can change at a re-rendezvous)."""
        self._node = node

    def decide(
        self, verdict: FailureVerdict, now: float | None = None, progress: int | None = None
    ) -> StopDecision:
        """Record one failed cycle's verdict and decide what follows it.

        Args:
            verdict: the cycle's verdict.
            now: ``time.monotonic()`` of the failure (default: now).
            progress: the highest step the job had reached at this failure (its ledger's);
                None when unknown.
        """
        now = time.monotonic() if now is None else now
        self._history.append((verdict, progress))
        attempt = int(verdict.evidence.get("attempt", 0))
        if verdict.cls is FailureClass.CONFIG and attempt == 0:
            return StopDecision(
                Action.STOP,
                "config_first_attempt",
                f"a configuration or import error in the first attempt: {verdict.summary()}; "
                "a restart would fail the same way",
            )
        if self._repeat and self._repeated():
            return StopDecision(
                Action.STOP,
                "repeated",
                f"the same failure in {self._repeat} consecutive attempts: "
                f"{verdict.summary()} (max_no_progress_cycles={self._repeat})",
            )
        if verdict.cls is FailureClass.GPU_HARDWARE and self._node in verdict.culprit_nodes:
            return StopDecision(
                Action.RESTART_WITHOUT_NODE,
                "gpu_hardware",
                f"GPU hardware failure on this node (node {self._node}): {verdict.cause}",
            )
        self._restarts.append(now)
        while self._restarts and now - self._restarts[0] > self._window:
            self._restarts.popleft()
        if self._storm and len(self._restarts) > self._storm:
            return StopDecision(
                Action.STOP,
                "restart_storm",
                f"a restart storm: {len(self._restarts)} failures within "
                f"{self._window:g} s (restart_storm_restarts={self._storm}); the latest: "
                f"{verdict.summary()}",
            )
        return StopDecision(Action.RESTART, "default", verdict.summary())

    def _repeated(self) -> bool:
        if len(self._history) < self._repeat:
            return False
        last = self._history[-self._repeat :]
        first = last[0][0]
        if first.cls in (FailureClass.UNKNOWN, FailureClass.PREEMPTION):
            return False
        if len({verdict.signature for verdict, _ in last}) != 1:
            return False
        steps = [progress for _, progress in last]
        if all(step is not None for step in steps):
            return len(set(steps)) == 1  # no step gained between the first and the last
        return first.rule in _REPEAT_BY_NATURE
