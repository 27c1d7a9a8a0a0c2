"""The exceptions of resiliency.ft: one base class, one subclass per kind of failure."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConfigNotFoundError",
    "FaultToleranceError",
    "MonitorRefusedError",
    "MonitorUnavailableError",
    "ProtocolError",
    "ProtocolVersionError",
    "RankMonitorClientError",
    "StateDictError",
]


class FaultToleranceError(Exception):
    """Base class of every error raised by resiliency.ft."""


class ConfigError(FaultToleranceError, ValueError):
    """The fault-tolerance configuration is invalid, missing or cannot be read."""


class ConfigNotFoundError(ConfigError):
    """The configuration file, or its ``fault_tolerance`` section, does not exist."""


class ProtocolError(FaultToleranceError):
    """A peer sent something that is not a valid monitor-protocol message."""


class RankMonitorClientError(FaultToleranceError):
    """The rank's client cannot do what was asked (NVIDIA's resiliency extension's name).

    Base of :class:`MonitorUnavailableError` and :class:`ProtocolVersionError`, so code written
    for that tool (``except RankMonitorClientError``) catches what ``init_workload_monitoring()``
    and the timeout calculation raise here.
    """


class ProtocolVersionError(ProtocolError, RankMonitorClientError):
    """The client and the rank monitor speak different protocol versions."""


class MonitorUnavailableError(RankMonitorClientError):
    """The rank monitor cannot be reached (not started, socket missing, or gone)."""


class MonitorRefusedError(MonitorUnavailableError):
    """The rank monitor refused the connection (wrong user, unexpected process, or busy)."""


class StateDictError(FaultToleranceError, ValueError):
    """A saved fault-tolerance state (``state_dict()`` output) is malformed."""
