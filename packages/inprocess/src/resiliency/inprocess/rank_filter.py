"""Rank filters: NVRx's deprecated ``rank_filter`` argument, kept so older scripts run.

A filter takes the ``State`` that ``rank_assignment`` produced, at the start of every
iteration, and decides which ranks call the wrapped function: ranks below the active world size
are active (their active rank is their rank), the others wait as spares. NVRx 0.4 merged this
into ``rank_assignment`` (``rank_assignment.MaxActiveWorldSize`` and
``ActiveWorldSizeDivisibleBy``); ``Wrapper(rank_filter=...)`` warns as NVRx does.
"""

from __future__ import annotations

import abc

from resiliency.inprocess.exception import ConfigError
from resiliency.inprocess.state import Mode, State

__all__ = ["MaxActiveWorldSize", "RankFilter", "WorldSizeDivisibleBy"]


class RankFilter(abc.ABC):
    """Base class of the ``rank_filter`` argument of ``Wrapper``; compose several with
    ``Compose``."""

    @abc.abstractmethod
    def __call__(self, state: State) -> State:
        """Set the active world size and this rank's mode.

        Args:
            state: the wrapper state after rank assignment, changed in place.

        Returns:
            ``state``.
        """


class MaxActiveWorldSize(RankFilter):
    """At most ``max_active_world_size`` ranks are active; None for no limit.

    Args:
        max_active_world_size: most active ranks, or None.
    """

    def __init__(self, max_active_world_size: int | None = None) -> None:
        if max_active_world_size is not None and max_active_world_size < 1:
            raise ConfigError(
                f"rank_filter.MaxActiveWorldSize({max_active_world_size}): must be >= 1 or None"
            )
        self.max_active_world_size = max_active_world_size

    def __call__(self, state: State) -> State:
        """Limit the active world size, and activate the ranks below it."""
        size = _active_size(state)
        if self.max_active_world_size is not None:
            size = min(size, self.max_active_world_size)
        return _activate_below(state, size)


class WorldSizeDivisibleBy(RankFilter):
    """The active world size is rounded down to a multiple of ``divisor``.

    Args:
        divisor: the active world size's divisor.
    """

    def __init__(self, divisor: int = 1) -> None:
        if divisor < 1:
            raise ConfigError(f"rank_filter.WorldSizeDivisibleBy({divisor}): must be >= 1")
        self.divisor = divisor

    def __call__(self, state: State) -> State:
        """Round the active world size down, and activate the ranks below it."""
        size = _active_size(state)
        return _activate_below(state, size - size % self.divisor)


def _active_size(state: State) -> int:
    return state.world_size if state.active_world_size is None else state.active_world_size


def _activate_below(state: State, size: int) -> State:
    state.active_world_size = size
    if state.rank < size:
        state.mode, state.active_rank = Mode.ACTIVE, state.rank
    else:
        state.mode, state.active_rank = Mode.INACTIVE, None
    return state
