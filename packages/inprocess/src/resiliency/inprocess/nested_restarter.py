"""NVRx's nested-restarter callbacks, for code written against NVRx 0.4.

NVRx's own launcher learns that a job restarts in-process from log lines its Wrapper callbacks
write on one rank (``[NestedRestarter] name=[InProcess] state=... stage=...``), so that it does
not restart the job itself meanwhile. ``ft-launcher`` needs no such lines: its agent watches the
workers' processes, and a worker that stays alive is never restarted by it. These classes keep an
NVRx script's ``initialize=`` and ``abort=`` arguments working unchanged and write the same
lines, at INFO, through ``logging`` (``resiliency.inprocess.nested_restarter``), for log tooling
that reads them.
"""

from __future__ import annotations

import logging

from resiliency.inprocess.abort import Abort
from resiliency.inprocess.initialize import Initialize
from resiliency.inprocess.state import FrozenState

__all__ = [
    "NestedRestarterCallback",
    "NestedRestarterHandlingCompleted",
    "NestedRestarterHandlingStarting",
]

log = logging.getLogger(__name__)


class NestedRestarterCallback:
    """Log the restarter's state (and stage) on ``special_rank`` only; return the state.

    Args:
        restarter_state: e.g. ``"initialize"`` or ``"handling"``.
        restarter_stage: e.g. ``"starting"`` or ``"completed"``; None for none.
        special_rank: the initial rank that writes the line.
    """

    def __init__(
        self, restarter_state: str, restarter_stage: str | None = None, special_rank: int = 0
    ) -> None:
        self.restarter_state = restarter_state
        self.restarter_stage = restarter_stage
        self.special_rank = special_rank

    def __call__(self, state: FrozenState) -> FrozenState:
        """Write the line when this is ``special_rank``."""
        if state.initial_rank == self.special_rank:
            stage = f" stage={self.restarter_stage}" if self.restarter_stage is not None else ""
            log.info(
                "active_rank=%s [NestedRestarter] name=[InProcess] state=%s%s",
                state.active_rank,
                self.restarter_state,
                stage,
            )
        return state


class NestedRestarterHandlingCompleted(Initialize, NestedRestarterCallback):
    """An ``initialize``: ``state=initialize`` at the first iteration, then ``state=handling
    stage=completed`` at every restart (the restart is done, training goes on)."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "initialize", None, special_rank)
        self._first = True

    def __call__(self, state: FrozenState) -> FrozenState:
        """Write the line, then switch to the restart's state for the next iterations."""
        NestedRestarterCallback.__call__(self, state)
        if self._first:
            self._first = False
            self.restarter_state, self.restarter_stage = "handling", "completed"
        return state


class NestedRestarterHandlingStarting(Abort, NestedRestarterCallback):
    """An ``abort`` step: ``state=handling stage=starting`` when a fault starts a restart."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "handling", "starting", special_rank)

    def __call__(self, state: FrozenState) -> FrozenState:
        """Write the line."""
        return NestedRestarterCallback.__call__(self, state)
