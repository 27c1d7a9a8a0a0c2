"""NVRx's nested-restarter callbacks, for code written against NVRx 0.4 and 0.5.

NVRx's own launcher learns that a job restarts in-process from log lines its Wrapper callbacks
write on one rank (``[NestedRestarter] name=[InProcess] state=... stage=...``), so that it does
not restart the job itself meanwhile. ``ft-launcher`` needs no such lines: its agent watches the
workers' processes, and a worker that stays alive is never restarted by it. These classes keep an
NVRx script's ``initialize=``, ``abort=``, ``completion=`` and ``terminate=`` arguments working
unchanged and write the same lines, at INFO, through ``logging``
(``resiliency.inprocess.nested_restarter``, or the logger a ``NestedRestarterLogger`` names),
for log tooling that reads them.
"""

from __future__ import annotations

import logging

from resiliency.inprocess.abort import Abort
from resiliency.inprocess.completion import Completion
from resiliency.inprocess.initialize import Initialize
from resiliency.inprocess.state import FrozenState
from resiliency.inprocess.terminate import Terminate

__all__ = [
    "NestedRestarterAborted",
    "NestedRestarterCallback",
    "NestedRestarterFinalized",
    "NestedRestarterHandlingCompleted",
    "NestedRestarterHandlingStarting",
    "NestedRestarterLogger",
]


class NestedRestarterLogger:
    """Where the callbacks write their lines (NVRx's name).

    Args:
        name: the ``logging`` logger they go to (``restarter_logger``); its handlers and level
            are the application's to set, as for any logger.
    """

    def __init__(self, name: str = "resiliency.inprocess.nested_restarter") -> None:
        self.restarter_logger = logging.getLogger(name)
        self.connected_rank: int | None = None

    def set_connected_rank(self, rank: int | None) -> None:
        """Record the rank that writes the lines (NVRx's log tooling names it)."""
        self.connected_rank = rank

    def log_for_restarter(self, message: str) -> None:
        """Write one line for the restarter's log tooling, at INFO."""
        self.restarter_logger.info(message)


#: The logger every callback uses unless given another (NVRx shares one the same way).
_SHARED_LOGGER = NestedRestarterLogger()


class NestedRestarterCallback:
    """Log the restarter's state (and stage) on ``special_rank`` only; return the state.

    Args:
        restarter_state: e.g. ``"initialize"`` or ``"handling"``.
        restarter_stage: e.g. ``"starting"`` or ``"completed"``; None for none.
        logger: where the line goes (default: one ``NestedRestarterLogger`` shared by all).
        special_rank: the initial rank that writes the line.
    """

    def __init__(
        self,
        restarter_state: str,
        restarter_stage: str | None = None,
        logger: NestedRestarterLogger | None = None,
        special_rank: int = 0,
    ) -> None:
        self.restarter_state = restarter_state
        self.restarter_stage = restarter_stage
        self.logger = _SHARED_LOGGER if logger is None else logger
        self.special_rank = special_rank

    def __call__(self, state: FrozenState) -> FrozenState:
        """Write the line when this is ``special_rank``."""
        if state.initial_rank == self.special_rank:
            self.logger.set_connected_rank(state.initial_rank)
            stage = f" stage={self.restarter_stage}" if self.restarter_stage is not None else ""
            self.logger.log_for_restarter(
                f"active_rank={state.active_rank} [NestedRestarter] name=[InProcess] "
                f"state={self.restarter_state}{stage}"
            )
        return state


class NestedRestarterHandlingCompleted(Initialize, NestedRestarterCallback):
    """An ``initialize``: ``state=initialize`` at the first iteration, then ``state=handling
    stage=completed`` at every restart (the restart is done, training goes on)."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "initialize", None, None, special_rank)
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
        NestedRestarterCallback.__init__(self, "handling", "starting", None, special_rank)

    def __call__(self, state: FrozenState) -> FrozenState:
        """Write the line."""
        return NestedRestarterCallback.__call__(self, state)


class NestedRestarterFinalized(Completion, NestedRestarterCallback):
    """A ``completion`` (NVRx 0.5): ``state=finalized`` once the job completed."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "finalized", None, None, special_rank)

    def __call__(self, state: FrozenState) -> FrozenState:
        """Write the line."""
        return NestedRestarterCallback.__call__(self, state)


class NestedRestarterAborted(Terminate, NestedRestarterCallback):
    """A ``terminate`` (NVRx 0.5): ``state=aborted`` when the rank leaves the job."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "aborted", None, None, special_rank)

    def __call__(self, state: FrozenState) -> FrozenState:
        """Write the line."""
        return NestedRestarterCallback.__call__(self, state)
