"""Errors of resiliency.supervisor: one base class, a few specific ones."""

from __future__ import annotations

__all__ = [
    "BackendAuthError",
    "BackendError",
    "BackendTLSError",
    "BackendUnavailableError",
    "PolicyError",
    "StaleGenerationError",
    "SupervisorError",
]


class SupervisorError(Exception):
    """Base class of every error this package raises."""


class BackendError(SupervisorError):
    """A backend URL is malformed, or a backend operation failed."""


class BackendUnavailableError(BackendError):
    """The engine behind a backend cannot be reached (or its client is not installed)."""


class BackendTLSError(BackendError):
    """A TLS file is missing or unusable, or the TLS handshake with etcd failed (wrong CA,
    certificate refused, host name mismatch). Never followed by a plain-HTTP attempt."""


class BackendAuthError(BackendError):
    """etcd refused this client: bad user or password, no user given while etcd's
    authentication is on, or no permission on a key (a user without the job's role)."""


class StaleGenerationError(SupervisorError):
    """A controller's generation of the job was replaced by a newer controller's: this one
    must not act any more."""


class PolicyError(SupervisorError):
    """A policy file or policy setting is invalid."""
