"""The simulator's errors: one base class, a subclass per way things go wrong."""

from __future__ import annotations

__all__ = ["InjectionError", "PlanError", "SimulatorError"]


class SimulatorError(Exception):
    """Base class of every error the simulator raises."""


class PlanError(SimulatorError, ValueError):
    """A fault plan cannot be drawn from the arguments given."""


class InjectionError(SimulatorError):
    """A fault could not be injected (no victim, no hook in the rank, no checkpoint to tear)."""
