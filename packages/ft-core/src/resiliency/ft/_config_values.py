"""Value types of FaultToleranceConfig that need parsing (seconds, signals, log levels), and
whether a field admits None."""

from __future__ import annotations

import difflib
import logging
import signal
import types
import typing
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer

# Signals that cannot be caught, so they can neither carry a stack-dump request nor let the
# rank clean up.
UNCATCHABLE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGSTOP})


def reject_bool(value: Any) -> Any:
    # pydantic's lax mode turns True into 1.0; in a config file that is almost always a mistake.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {value}")
    return value


def _parse_signal(value: Any) -> signal.Signals:
    if isinstance(value, signal.Signals):
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a signal name or number, got the boolean {value}")
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, int):
        try:
            return signal.Signals(value)
        except ValueError:
            raise ValueError(f"{value} is not a signal number on this system") from None
    if isinstance(value, str):
        name = value.strip().upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        members = signal.Signals.__members__
        if name in members:
            return members[name]
        close = difflib.get_close_matches(name, list(members), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else " (e.g. 'SIGTERM', 'TERM' or 15)"
        raise ValueError(f"unknown signal {value!r}{hint}")
    raise ValueError(f"expected a signal name or number, got {type(value).__name__}")


def _parse_log_level(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected a log level name or number, got the boolean {value}")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a log level must not be negative, got {value}")
        return value
    if isinstance(value, str):
        # getLevelName maps a registered level name to its number (documented for str input).
        level = logging.getLevelName(value.strip().upper())
        if isinstance(level, int):
            return level
        raise ValueError(
            f"unknown log level {value!r}; use DEBUG, INFO, WARNING, ERROR, CRITICAL or a number"
        )
    raise ValueError(f"expected a log level name or number, got {type(value).__name__}")


def _log_level_name(level: int) -> str | int:
    name = logging.getLevelName(level)
    return name if isinstance(name, str) and not name.startswith("Level ") else level


Seconds = Annotated[float, BeforeValidator(reject_bool), Field(gt=0, allow_inf_nan=False)]
NonNegativeInt = Annotated[int, BeforeValidator(reject_bool), Field(ge=0)]
NonNegativeSeconds = Annotated[
    float, BeforeValidator(reject_bool), Field(ge=0, allow_inf_nan=False)
]
Signal = Annotated[
    signal.Signals,
    BeforeValidator(_parse_signal),
    PlainSerializer(lambda s: s.name, return_type=str, when_used="json"),
    Field(json_schema_extra={"doc_type": "signal name or number", "metavar": "SIGNAL"}),
]
LogLevel = Annotated[
    int,
    BeforeValidator(_parse_log_level),
    PlainSerializer(_log_level_name, return_type=str | int, when_used="json"),
    Field(json_schema_extra={"doc_type": "log level name or number", "metavar": "LEVEL"}),
]


def check_safety_factor(value: Any) -> Any:
    """Reject a safety factor below 1 with the reason (NVIDIA's resiliency extension accepts it).

    Args:
        value: the raw value; anything that is not a number is left to pydantic.

    Returns:
        ``value`` unchanged.

    Raises:
        ValueError: a number below 1.
    """
    value = reject_bool(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    if number < 1.0:
        raise ValueError(
            f"safety_factor must be >= 1, got {value!r}: a calculated timeout shorter than the "
            "longest interval observed would kill healthy ranks (NVIDIA's resiliency extension "
            "accepts it; this toolkit does not, see docs/coming_from_nvidia_resiliency_ext.md)"
        )
    return value


def is_optional(annotation: Any) -> bool:
    """Whether a field's type annotation admits None (``X | None`` or ``Optional[X]``).

    Args:
        annotation: the field's annotation.

    Returns:
        True when None is one of the union's members.
    """
    origin = typing.get_origin(annotation)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)
