"""A ``UserWarning`` when the application has not configured logging, as NVRx's wrapper gives.

NVRx's wrapper warns "logging not initialized, logs are disabled" and then drops its own logs.
Here nothing is dropped (without a handler, Python's last-resort handler still prints warnings
and errors to stderr), but the INFO lines that say what each restart did would be lost unseen.
"""

from __future__ import annotations

import logging
import warnings


def warn_if_unconfigured(logger: logging.Logger) -> None:
    """Warn when no handler on ``logger``'s way to the root would show its records.

    Args:
        logger: the wrapper's logger; its handlers and its ancestors' are looked at, never
            changed.
    """
    if logger.hasHandlers():
        return
    warnings.warn(
        f"logging is not configured, so {logger.name}'s INFO lines (each restart's cause, "
        "ranks and phase times) are not shown; its warnings and errors still reach stderr. "
        "Configure logging before calling the wrapped function, e.g. "
        "logging.basicConfig(level=logging.INFO)",
        UserWarning,
        stacklevel=3,
    )
