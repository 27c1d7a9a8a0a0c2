"""The package's one base error."""

from __future__ import annotations


class GoodputError(Exception):
    """Base error of resiliency.goodput (bad arguments, unreadable ledgers, missing extras)."""


class MissingDependencyError(GoodputError):
    """An optional dependency (matplotlib, for plots) is not installed."""


class ConfigError(GoodputError, ValueError):
    """An invalid setting (e.g. `AutoInterval` bounds)."""
