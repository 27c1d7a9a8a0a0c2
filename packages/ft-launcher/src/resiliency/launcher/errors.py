"""The exceptions of resiliency.launcher: one base class, one subclass per kind of failure."""

from __future__ import annotations

__all__ = [
    "ForkServerError",
    "HealthCheckError",
    "LauncherConfigError",
    "LauncherError",
    "TorchVersionError",
]


class LauncherError(Exception):
    """Base class of every error raised by resiliency.launcher."""


class LauncherConfigError(LauncherError, ValueError):
    """A launcher option is invalid (bad flag value, conflicting flags)."""


class TorchVersionError(LauncherError):
    """The installed torch lacks an extension point the launcher relies on."""


class HealthCheckError(LauncherError):
    """A node health check could not be set up (unknown callable, empty command)."""


class ForkServerError(LauncherError):
    """The fork server (``--ft-preimport``) could not start, or stopped answering."""
