"""Rank assignment: who is who after a restart, and which ranks call the function.

A ``RankAssignment`` takes a ``RankAssignmentCtx`` (the rank's state, the store, and the ranks
of the previous iteration that left the job) and returns it updated. Chain several with
``Compose``: ``Compose(ActivateAllRanks(), ShiftRanks())`` (the default) first closes the gaps
(``ShiftRanks``), then makes every remaining rank active.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

from resiliency.inprocess.exception import ConfigError, RestartError
from resiliency.inprocess.state import Mode, State


class RankDiscarded(RestartError):  # noqa: N818 - NVRx's name
    """This rank is not part of the next iteration (it was reported terminated)."""


@dataclasses.dataclass
class RankAssignmentCtx:
    """What a ``RankAssignment`` works on.

    Attributes:
        state: this rank's state, updated in place.
        store: the wrapper's store (a ``torch.distributed.Store``) for assignments that agree.
        terminated_ranks: ranks (of ``state.rank``'s numbering) that left the job.
    """

    state: State
    store: Any
    terminated_ranks: set[int]


class RankAssignment(abc.ABC):
    """Base class of the ``rank_assignment`` argument of ``Wrapper``."""

    @abc.abstractmethod
    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Reassign ranks.

        Args:
            ctx: the state, store and terminated ranks.

        Returns:
            The updated context.
        """


def _check_alive(ctx: RankAssignmentCtx) -> None:
    if ctx.state.rank in ctx.terminated_ranks:
        raise RankDiscarded(
            f"rank {ctx.state.rank} (initial rank {ctx.state.initial_rank}) was reported "
            f"terminated (terminated ranks: {sorted(ctx.terminated_ranks)})"
        )


class ShiftRanks(RankAssignment):
    """Close the gaps left by terminated ranks, keeping the others' order.

    Ranks ``0 X 2 3 X 5`` become ``0 1 2 3`` (old 2 -> 1, 3 -> 2, 5 -> 3).
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Shift every surviving rank down by the number of terminated ranks below it."""
        _check_alive(ctx)
        state = ctx.state
        state.rank -= sum(1 for dead in ctx.terminated_ranks if dead < state.rank)
        state.world_size -= len(ctx.terminated_ranks)
        ctx.terminated_ranks = set()
        return ctx


class FillGaps(RankAssignment):
    """Keep surviving ranks where they are; move the highest ranks into the gaps.

    Ranks ``0 X 2 3 X 5`` become ``0 5 2 3`` (only old 5 moves, to 1).
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Move each rank at or past the new world size into the lowest free gap."""
        _check_alive(ctx)
        state = ctx.state
        new_size = state.world_size - len(ctx.terminated_ranks)
        if state.rank >= new_size:
            gaps = sorted(dead for dead in ctx.terminated_ranks if dead < new_size)
            movers = sorted(
                r for r in range(new_size, state.world_size) if r not in ctx.terminated_ranks
            )
            state.rank = gaps[movers.index(state.rank)]
        state.world_size = new_size
        ctx.terminated_ranks = set()
        return ctx


class ActivateAllRanks(RankAssignment):
    """Make every rank active: active rank = rank, active world size = world size."""

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Activate this rank."""
        state = ctx.state
        state.active_rank = state.rank
        state.active_world_size = state.world_size
        state.mode = Mode.ACTIVE
        return ctx


class MaxActiveWorldSize(RankAssignment):
    """Keep at most ``max_active_world_size`` ranks active; the rest wait as spares.

    Args:
        max_active_world_size: most active ranks; None for all of them.
    """

    def __init__(self, max_active_world_size: int | None = None) -> None:
        if max_active_world_size is not None and max_active_world_size < 1:
            raise ConfigError(
                f"MaxActiveWorldSize(max_active_world_size={max_active_world_size}): must be >= 1"
            )
        self.max_active_world_size = max_active_world_size

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Deactivate ranks past the limit."""
        _limit_active(ctx.state, self.max_active_world_size or ctx.state.world_size)
        return ctx


class ActiveWorldSizeDivisibleBy(RankAssignment):
    """Round the active world size down to a multiple of ``divisor``; the rest are spares.

    Args:
        divisor: the active world size must be a multiple of it.
    """

    def __init__(self, divisor: int = 1) -> None:
        if divisor < 1:
            raise ConfigError(f"ActiveWorldSizeDivisibleBy(divisor={divisor}): must be >= 1")
        self.divisor = divisor

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Deactivate the ranks past the largest multiple of ``divisor``."""
        size = ctx.state.active_world_size or ctx.state.world_size
        _limit_active(ctx.state, size - size % self.divisor)
        return ctx


def _limit_active(state: State, limit: int) -> None:
    size = min(state.active_world_size or state.world_size, limit)
    state.active_world_size = size
    if state.active_rank is not None and state.active_rank >= size:
        state.active_rank = None
        state.mode = Mode.INACTIVE
