"""Errors of resiliency.supervisor: one base class, a few specific ones."""

from __future__ import annotations

__all__ = ["BackendError", "BackendUnavailableError", "PolicyError", "SupervisorError"]


class SupervisorError(Exception):
    """Base class of every error this package raises."""


class BackendError(SupervisorError):
    """A backend URL is malformed, or a backend operation failed."""


class BackendUnavailableError(BackendError):
    """The engine behind a backend cannot be reached (or its client is not installed)."""


class PolicyError(SupervisorError):
    """A policy file or policy setting is invalid."""
