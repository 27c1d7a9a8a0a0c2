"""Goodput events of saves and loads, sent through :mod:`resiliency.goodput`."""

from __future__ import annotations

import logging
from typing import Any

from resiliency.goodput import get_recorder

logger = logging.getLogger(__name__)


def emit(event: str, **fields: Any) -> None:
    """Emit one goodput event; never raises (a broken ledger must not fail a checkpoint)."""
    try:
        get_recorder().emit(event, **fields)
    except Exception as exc:
        logger.warning("could not record goodput event %s %s: %s", event, fields, exc)


def saved(step: int, tier: str, nbytes: int, blocked_s: float, total_s: float) -> None:
    """Emit ``checkpoint_saved`` for one tier of one step (times to the microsecond)."""
    emit(
        "checkpoint_saved",
        step=step,
        tier=tier,
        bytes=nbytes,
        blocked_s=round(blocked_s, 6),
        total_s=round(total_s, 6),
    )


def flush() -> None:
    """Write the queued goodput events now (before the process exits); never raises."""
    try:
        get_recorder().flush()
    except Exception as exc:  # a broken ledger must never stop the exit
        logger.debug("goodput flush skipped: %s", exc)
