"""The exceptions of resiliency.ft: one base class, one subclass per kind of failure."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "FaultToleranceError",
    "MonitorUnavailableError",
    "ProtocolError",
    "ProtocolVersionError",
]


class FaultToleranceError(Exception):
    """Base class of every error raised by resiliency.ft."""


class ConfigError(FaultToleranceError, ValueError):
    """The fault-tolerance configuration is invalid, missing or cannot be read."""


class ProtocolError(FaultToleranceError):
    """A peer sent something that is not a valid monitor-protocol message."""


class ProtocolVersionError(ProtocolError):
    """The client and the rank monitor speak different protocol versions."""


class MonitorUnavailableError(FaultToleranceError):
    """The rank monitor cannot be reached (not started, socket missing, or gone)."""
