"""Wall-time parsing shared by the ledger reader and the Google log import."""

from __future__ import annotations

from datetime import datetime
from typing import Any

_minute_cache: dict[str, float] = {}


def parse_time(value: Any) -> float:
    """ISO 8601 (or epoch seconds) to epoch seconds; fast for the writer's own UTC format."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"not a time: {value!r}")
    # 2026-11-23T01:02:03.456789+00:00: cache the minute, add the seconds.
    if len(value) == 32 and value.endswith("+00:00") and value[16] == ":":
        base = _minute_cache.get(value[:16])
        if base is None:
            base = datetime.fromisoformat(value[:16] + ":00+00:00").timestamp()
            _minute_cache[value[:16]] = base
        return base + float(value[17:26])
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"time without a time zone: {value!r}")
    return moment.timestamp()


def format_duration(seconds: float) -> str:
    """``1h 02m 03s`` style, for humans."""
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{sign}{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{sign}{hours}h {minutes:02d}m {secs:02d}s"
    return f"{sign}{minutes}m {secs:02d}s"


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``1h``, ``2d`` to seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    raw = text.strip().lower()
    scale = units.get(raw[-1:])
    number = raw[:-1] if scale is not None else raw
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 1h)") from None
    if value <= 0:
        raise ValueError(f"a duration must be positive: {text!r}")
    return value
