"""Initialize callbacks: run at the start of every iteration, the first one included.

Raising an ``Exception`` there is a fault (another restart); raising ``RestartAbort`` stops.
"""

from __future__ import annotations

import abc

from resiliency.inprocess.exception import RestartAbort
from resiliency.inprocess.state import FrozenState


class Initialize(abc.ABC):
    """Base class of the ``initialize`` argument of ``Wrapper``."""

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        """Prepare this rank for an iteration.

        Args:
            state: read-only wrapper state.

        Returns:
            ``state``, unchanged.
        """


class RetryController(Initialize):
    """Stop restarting past ``max_iterations``, or when too few ranks are left.

    Args:
        max_iterations: how many iterations may start, the first call included (as in NVRx:
            iteration ``max_iterations`` is stopped); None for no limit.
        min_world_size: fewest processes still in the job.
        min_active_world_size: fewest ranks calling the function.
    """

    def __init__(
        self,
        max_iterations: int | None = None,
        min_world_size: int = 1,
        min_active_world_size: int = 1,
    ) -> None:
        self.max_iterations = max_iterations
        self.min_world_size = min_world_size
        self.min_active_world_size = min_active_world_size

    def __call__(self, state: FrozenState) -> FrozenState:
        """Raise ``RestartAbort`` when a limit is passed.

        Raises:
            RestartAbort: iteration, world size or active world size out of bounds.
        """
        active = state.active_world_size or 0
        if self.max_iterations is not None and state.iteration >= self.max_iterations:
            raise RestartAbort(
                f"rank {state.rank}: iteration={state.iteration} reached "
                f"RetryController(max_iterations={self.max_iterations}) (the wrapped function "
                f"ran {self.max_iterations} time(s)); stopping"
            )
        if state.world_size < self.min_world_size or active < self.min_active_world_size:
            raise RestartAbort(
                f"rank {state.rank}: {state.world_size} ranks left ({active} active), fewer than "
                f"RetryController(min_world_size={self.min_world_size}, "
                f"min_active_world_size={self.min_active_world_size}); stopping"
            )
        return state
