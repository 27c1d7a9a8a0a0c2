"""Readable configuration errors: pydantic's errors as ``field: what is wrong``, typo hints."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from resiliency.ft.errors import ConfigError


class InvalidConfigError(ConfigError):
    """A ConfigError that keeps pydantic's structured errors, so callers can relabel fields."""

    def __init__(self, validation_error: ValidationError) -> None:
        super().__init__(format_validation_error(validation_error))
        self.validation_error = validation_error


def closest_key(key: str, choices: list[str]) -> str | None:
    """Return the valid name closest to a mistyped one, or None when nothing is close.

    Args:
        key: the mistyped name.
        choices: the valid names.

    Returns:
        The closest valid name, or None.
    """
    matches = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_keys_message(keys: Iterable[Any], valid: list[str]) -> str:
    """Name each unknown key with the closest valid one, or list the valid ones.

    Args:
        keys: the unknown keys.
        valid: the valid keys.

    Returns:
        One line per unknown key.
    """
    parts = []
    for key in keys:
        close = closest_key(str(key), valid)
        if close:
            parts.append(f"unknown key {str(key)!r}; did you mean {close!r}?")
        else:
            parts.append(f"unknown key {str(key)!r}; valid keys are: {', '.join(valid)}")
    return "\n".join(parts)


def format_validation_error(
    exc: ValidationError, name_of: Callable[[str], str] | None = None
) -> str:
    """Turn a pydantic ValidationError into one part per problem: ``field: what is wrong``.

    Args:
        exc: the error raised by pydantic.
        name_of: how to show a field's name (e.g. as the flags that set it).

    Returns:
        A readable message, starting with "invalid fault-tolerance config".
    """
    lines = []
    for error in exc.errors():
        message = str(error["msg"])
        # Errors raised by our validators arrive prefixed with pydantic's category.
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)
        location = ""
        if error["loc"]:
            field, *inner = error["loc"]
            location = name_of(str(field)) if name_of is not None else str(field)
            location += "".join(f"[{part!r}]" for part in inner)
        shown_input = "" if error["type"] == "value_error" else f" (got {error['input']!r})"
        lines.append(f"{location}: {message}{shown_input}" if location else message)
    return "invalid fault-tolerance config: " + "; ".join(lines)
