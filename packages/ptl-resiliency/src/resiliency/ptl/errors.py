"""The exceptions of resiliency.ptl: one base class, one subclass per kind of failure."""

from __future__ import annotations

from resiliency.ft import MonitorUnavailableError

__all__ = ["AutoResumeConfigError", "LauncherRequiredError", "PtlResiliencyError"]


class PtlResiliencyError(Exception):
    """Base class of every error raised by resiliency.ptl."""


class LauncherRequiredError(PtlResiliencyError, MonitorUnavailableError):
    """A fault-tolerance callback found no rank monitor: the job was not started by ft-launcher."""


class AutoResumeConfigError(PtlResiliencyError, ValueError):
    """``autoresume=True`` but the job does not say where to write the finished flag.

    Raised as a configuration error: uncaught, it ends the rank with exit code 78 and
    ft-launcher exits 2 (fix the configuration) instead of restarting.
    """
