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
