"""Exceptions raised by :mod:`resiliency.straggler`; all derive from :class:`StragglerError`."""

from __future__ import annotations

__all__ = [
    "DetectorStateError",
    "ExchangeError",
    "MissingDependencyError",
    "ReportHistoryError",
    "StragglerConfigError",
    "StragglerError",
]


class StragglerError(Exception):
    """Base class of every error this package raises."""


class StragglerConfigError(StragglerError, ValueError):
    """An argument or setting is out of range or of the wrong kind."""


class DetectorStateError(StragglerError, RuntimeError):
    """The Detector was used in the wrong state (not initialized, initialized twice, ...)."""


class ExchangeError(StragglerError, RuntimeError):
    """The cross-rank exchange of timing summaries failed."""


class ReportHistoryError(StragglerError, ValueError):
    """A report history file is malformed or holds no reports."""


class MissingDependencyError(StragglerError, ImportError):
    """An optional dependency needed by the requested feature is not installed."""
