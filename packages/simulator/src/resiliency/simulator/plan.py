"""A seeded, reproducible schedule of faults: the same seed always gives the same plan."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from resiliency.simulator.errors import PlanError

__all__ = ["FAULT_KINDS", "NODE_FAULTS", "Fault", "FaultPlan"]

#: Every fault kind the simulator can inject, in the order the docs describe them.
FAULT_KINDS = (
    "kill",
    "crash",
    "hang",
    "hang_nogil",
    "stop",
    "slow",
    "preempt",
    "torn_checkpoint",
    "disk_full",
    "node_loss",
)
#: Kinds whose victim is a node (its launcher), not a rank.
NODE_FAULTS = frozenset({"preempt", "node_loss"})
#: Kinds whose victim is the checkpoint storage, not a process.
STORAGE_FAULTS = frozenset({"torn_checkpoint", "disk_full"})


@dataclass(frozen=True)
class Fault:
    """One planned injection.

    Attributes:
        at_s: seconds after the job started.
        kind: one of ``FAULT_KINDS``.
        victim: a seeded draw; the rank (or node) hit is ``victim % number of candidates`` at the
            moment of injection, so a plan stays valid whatever the job's size.
        seed: a per-fault seed for the kind's own choices (which byte to flip, ...).
    """

    at_s: float
    kind: str
    victim: int
    seed: int

    def describe(self) -> str:
        """Return a one-line description for logs and tables."""
        return f"{self.kind} at {self.at_s:.1f} s (victim draw {self.victim})"


@dataclass(frozen=True)
class FaultPlan:
    """A reproducible fault schedule.

    Attributes:
        seed: the seed it was drawn from.
        mtbf: mean time between faults, seconds.
        keep_alive: the minimum quiet time before the first fault and between two faults, so
            that the job can recover and make progress in between.
        faults: the planned injections, in time order.
    """

    seed: int
    mtbf: float
    keep_alive: float
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    @classmethod
    def from_seed(  # noqa: PLR0917 (the call users write: seed, kinds, mtbf, ...)
        cls,
        seed: int,
        faults: list[str] | tuple[str, ...] = ("kill",),
        mtbf: float = 60.0,
        keep_alive: float = 0.0,
        duration: float | None = None,
        count: int | None = None,
    ) -> FaultPlan:
        """Draw a schedule with exponential inter-arrival times and seeded victims.

        Args:
            seed: any integer; the same seed and arguments always give the same plan.
            faults: the kinds to draw from, uniformly.
            mtbf: the mean of the exponential inter-arrival time, in seconds.
            keep_alive: the minimum gap before the first fault and between faults, in seconds.
            duration: plan faults only before this many seconds.
            count: plan at most this many faults. One of ``duration`` or ``count`` is required.

        Returns:
            The plan.

        Raises:
            PlanError: an unknown kind, a non-positive MTBF, or neither a duration nor a count.
        """
        kinds = tuple(faults)
        unknown = [k for k in kinds if k not in FAULT_KINDS]
        if unknown or not kinds:
            raise PlanError(
                f"unknown fault kind(s) {unknown or '(none given)'}; "
                f"choose from {', '.join(FAULT_KINDS)}"
            )
        if mtbf <= 0:
            raise PlanError(f"mtbf must be > 0 seconds, got {mtbf}")
        if keep_alive < 0:
            raise PlanError(f"keep_alive must be >= 0 seconds, got {keep_alive}")
        if duration is None and count is None:
            raise PlanError("give a duration or a count: an unbounded plan never ends")
        rng = random.Random(seed)  # noqa: S311 (a reproducible schedule, not security)
        planned: list[Fault] = []
        t = 0.0
        while count is None or len(planned) < count:
            t += max(rng.expovariate(1.0 / mtbf), keep_alive)
            if duration is not None and t >= duration:
                break
            planned.append(
                Fault(
                    at_s=round(t, 3),
                    kind=rng.choice(kinds),
                    victim=rng.randrange(2**31),
                    seed=rng.randrange(2**31),
                )
            )
        return cls(seed=seed, mtbf=mtbf, keep_alive=keep_alive, faults=tuple(planned))

    def __len__(self) -> int:
        return len(self.faults)
