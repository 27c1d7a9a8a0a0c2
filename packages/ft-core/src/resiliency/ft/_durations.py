"""How logs and messages write a duration: short, human, and ``no limit`` for None."""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["format_limit", "format_seconds", "format_timeouts"]


def format_seconds(value: float) -> str:
    """Write a duration in seconds for people: ``0.25 s``, ``3 s``, ``90.5 s``, ``1 h 0 min``.

    Three significant digits below ten seconds, one decimal below an hour; never the 16 digits
    a float's ``repr`` carries (a calculated timeout is a product of measurements).

    Args:
        value: Seconds (finite or not).

    Returns:
        The text, with its unit.
    """
    if not math.isfinite(value):
        return f"{value} s"
    if value >= 3600:
        hours, rest = divmod(round(value), 3600)
        return f"{hours} h {rest // 60} min" if rest >= 60 else f"{hours} h"
    if value >= 10:
        return f"{value:.1f}".removesuffix(".0") + " s"
    return f"{value:.3g} s"


def format_limit(value: float | None) -> str:
    """Like :func:`format_seconds`, with None written as ``no limit``."""
    return "no limit" if value is None else format_seconds(value)


def format_timeouts(
    initial: float | None,
    heartbeat: float | None,
    sections: Mapping[str, float | None] | None = None,
    out_of_section: float | None = None,
) -> str:
    """Write a set of timeouts on one line: ``initial 0.916 s, heartbeat 5 s, ...``.

    Args:
        initial: The initial heartbeat timeout.
        heartbeat: The subsequent heartbeat timeout.
        sections: Section name -> timeout; None leaves sections out of the line.
        out_of_section: The out-of-section timeout (written with ``sections`` only).

    Returns:
        The line.
    """
    parts = [f"initial {format_limit(initial)}", f"heartbeat {format_limit(heartbeat)}"]
    if sections is not None:
        named = ", ".join(f"{name} {format_limit(limit)}" for name, limit in sections.items())
        parts.append(f"sections {{{named}}}")
        parts.append(f"out of section {format_limit(out_of_section)}")
    return ", ".join(parts)
