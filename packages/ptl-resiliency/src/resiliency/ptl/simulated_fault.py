"""Simulated faults: kill or hang one rank after a delay, to rehearse recovery on any machine."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["FAULT_TYPES", "SimulatedFaultParams"]

FAULT_TYPES = ("rank_killed", "rank_hung", "random")
_CONCRETE_FAULTS = ("rank_killed", "rank_hung")

FaultType = Literal["rank_killed", "rank_hung", "random"]


@dataclasses.dataclass(frozen=True)
class SimulatedFaultParams:
    """When and how to simulate a fault.

    The fault fires ``base_delay + uniform(0, rand_delay)`` seconds after training starts, on rank
    ``rank_to_fail`` (a random rank, agreed on by every rank, when None). ``rank_killed`` sends
    SIGKILL to that rank's process; ``rank_hung`` stops its training loop at the next training
    batch (inside the ``step`` section when sections are used), so heartbeats and sections stop;
    ``random`` picks one of the two.

    Args:
        fault_type: ``"rank_killed"``, ``"rank_hung"`` or ``"random"``.
        base_delay: Seconds after training start, >= 0.
        rand_delay: Extra random seconds, >= 0.
        rank_to_fail: Global rank that fails, or None for a random one.

    Raises:
        ValueError: A value is out of range or the fault type is unknown.
    """

    fault_type: FaultType
    base_delay: float
    rand_delay: float = 0.0
    rank_to_fail: int | None = None

    def __post_init__(self) -> None:
        if self.fault_type not in FAULT_TYPES:
            raise ValueError(
                f"simulated fault_type must be one of {', '.join(FAULT_TYPES)}, "
                f"got {self.fault_type!r}"
            )
        for name in ("base_delay", "rand_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"simulated fault {name} must be a number >= 0, got {value!r}")
        rank = self.rank_to_fail
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(
                f"simulated fault rank_to_fail must be an int >= 0 or None, got {rank!r}"
            )

    @classmethod
    def coerce(
        cls, value: SimulatedFaultParams | Mapping[str, Any] | None
    ) -> SimulatedFaultParams | None:
        """Accept the dataclass, a mapping with the same keys, or None.

        Args:
            value: What the user passed as ``simulated_fault_params``.

        Returns:
            The parameters, or None when no fault is wanted.

        Raises:
            ValueError: Unknown or missing keys, or invalid values.
        """
        if value is None or isinstance(value, SimulatedFaultParams):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                "simulated_fault_params must be a SimulatedFaultParams, a mapping or None, "
                f"got {type(value).__name__}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"unknown simulated_fault_params key(s) {unknown}; valid keys: {sorted(known)}"
            )
        for required in ("fault_type", "base_delay"):
            if required not in value:
                raise ValueError(f"simulated_fault_params needs {required!r}")
        return cls(**dict(value))


class _FaultInjector:
    """Arms a timer on the failing rank; the training loop asks it whether to hang now."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._timer: threading.Timer | None = None
        self._hang_now = threading.Event()

    def plan(self, params: SimulatedFaultParams, world_size: int) -> tuple[str, int, float]:
        """Draw the concrete fault, rank and delay (call on rank 0, then broadcast)."""
        rng = random.Random()  # noqa: S311 (fault timing, not security)
        fault: str = params.fault_type
        if fault == "random":
            fault = rng.choice(_CONCRETE_FAULTS)
        rank = params.rank_to_fail if params.rank_to_fail is not None else rng.randrange(world_size)
        delay = params.base_delay + rng.uniform(0.0, params.rand_delay)
        return fault, rank, delay

    def arm(self, plan: tuple[str, int, float], my_rank: int) -> None:
        """Start the timer if this rank is the one that fails."""
        fault, rank, delay = plan
        if rank != my_rank:
            return
        self._log.warning("rank %d: simulated fault %r will fire in %.2f s", my_rank, fault, delay)
        self._timer = threading.Timer(delay, self._fire, args=(fault, my_rank))
        self._timer.daemon = True
        self._timer.start()

    def _fire(self, fault: str, rank: int) -> None:
        if fault == "rank_killed":
            self._log.error("rank %d: simulated fault: killing this rank (SIGKILL)", rank)
            for handler in self._log.handlers + logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            self._log.error("rank %d: simulated fault: this rank hangs at its next step", rank)
            self._hang_now.set()

    def maybe_hang(self) -> None:
        """Block the calling (training) thread forever once a ``rank_hung`` fault has fired."""
        if not self._hang_now.is_set():
            return
        # A real hang: nothing here returns; the rank monitor is expected to kill the process.
        while True:
            time.sleep(1.0)

    def disarm(self) -> None:
        """Cancel a fault that has not fired yet (training ended first)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
