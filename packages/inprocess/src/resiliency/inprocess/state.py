"""The wrapper's per-rank state: ``State`` (mutable, owned by the wrapper) and ``FrozenState``.

Every callback receives a ``FrozenState``: a read-only snapshot of where this rank stands in the
restart loop.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Iterable

from resiliency.inprocess.exception import ConfigError


class Mode(enum.Enum):
    """What a rank does in the current iteration."""

    INITIALIZED = enum.auto()
    ACTIVE = enum.auto()  # calls the wrapped function
    INACTIVE = enum.auto()  # a spare: waits, alive, until a fault or the end
    TERMINATED = enum.auto()  # left the job (failed health check, discarded)


@dataclasses.dataclass(frozen=True)
class FrozenState:
    """A read-only snapshot of a rank's ``State``.

    Attributes:
        rank: this process's rank among the processes still in the job.
        world_size: number of processes still in the job.
        active_rank: rank among the ranks calling the function (None for a spare).
        active_world_size: number of ranks calling the function.
        initial_rank: the rank this process started with (``RANK`` at the first call).
        initial_world_size: the world size at the first call.
        iteration: restart iteration, 0 for the first call.
        mode: what this rank does in this iteration.
        fn_exception: the exception the wrapped function raised on this rank in this iteration
            (None if none, and again once the next iteration starts).
    """

    rank: int
    world_size: int
    active_rank: int | None = None
    active_world_size: int | None = None
    # None only in a snapshot built by hand (NVRx accepts it); freeze() always sets them.
    initial_rank: int = None  # type: ignore[assignment]
    initial_world_size: int = None  # type: ignore[assignment]
    iteration: int = 0
    mode: Mode = Mode.INITIALIZED
    fn_exception: BaseException | None = None


@dataclasses.dataclass
class State:
    """The mutable state the wrapper keeps for one rank (see ``FrozenState`` for the fields).

    As in NVRx, ``State(rank, world_size)`` is enough: ``initial_rank`` and
    ``initial_world_size`` default to ``rank`` and ``world_size``, the active ones to None
    (set by the rank assignment).
    """

    rank: int
    world_size: int
    active_rank: int | None = None
    active_world_size: int | None = None
    # None (NVRx's default) stands for rank and world_size: __post_init__ sets them.
    initial_rank: int = None  # type: ignore[assignment]
    initial_world_size: int = None  # type: ignore[assignment]
    iteration: int = 0
    mode: Mode = Mode.INITIALIZED
    fn_exception: BaseException | None = None

    def __post_init__(self) -> None:
        if self.initial_rank is None:
            self.initial_rank = self.rank
        if self.initial_world_size is None:
            self.initial_world_size = self.world_size

    @classmethod
    def from_env(cls) -> State:
        """Build the first state from ``RANK`` and ``WORLD_SIZE`` (set by torchrun).

        Raises:
            ConfigError: either variable is missing or not a valid rank / size.
        """
        try:
            rank = int(os.environ["RANK"])
            world_size = int(os.environ["WORLD_SIZE"])
        except (KeyError, ValueError) as exc:
            raise ConfigError(
                "resiliency.inprocess.Wrapper needs RANK and WORLD_SIZE in the environment "
                f"(got RANK={os.environ.get('RANK')!r}, "
                f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}); start the job with torchrun "
                "or ft-launcher, or set both"
            ) from exc
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"RANK={rank} is not a rank of WORLD_SIZE={world_size}")
        return cls(
            rank=rank,
            world_size=world_size,
            active_rank=rank,
            active_world_size=world_size,
            initial_rank=rank,
            initial_world_size=world_size,
        )

    def freeze(self) -> FrozenState:
        """Return a read-only copy for callbacks."""
        return FrozenState(
            rank=self.rank,
            world_size=self.world_size,
            active_rank=self.active_rank,
            active_world_size=self.active_world_size,
            initial_rank=self.initial_rank,
            initial_world_size=self.initial_world_size,
            iteration=self.iteration,
            mode=self.mode,
            fn_exception=self.fn_exception,
        )

    def set_distributed_vars(self) -> None:
        """Export this iteration's ``RANK`` and ``WORLD_SIZE`` for the wrapped function."""
        if self.active_rank is not None and self.active_world_size is not None:
            os.environ["RANK"] = str(self.active_rank)
            os.environ["WORLD_SIZE"] = str(self.active_world_size)

    def advance(self) -> None:
        """Move to the next restart iteration (whose function has raised nothing yet)."""
        self.iteration += 1
        self.fn_exception = None

    def copy_from(self, other: State | FrozenState, fields: Iterable[str] | None = None) -> None:
        """Take ``other``'s values: every field, or only those named in ``fields``."""
        names = None if fields is None else set(fields)
        for field in dataclasses.fields(self):
            if names is None or field.name in names:
                setattr(self, field.name, getattr(other, field.name))
