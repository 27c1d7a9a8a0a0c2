"""Readable configuration errors: pydantic's errors as ``field: what is wrong``, typo hints."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from resiliency.ft.errors import ConfigError


class InvalidConfigError(ConfigError):
    """A ConfigError that keeps pydantic's structured errors, so callers can relabel fields."""

    def __init__(self, validation_error: ValidationError) -> None:
        super().__init__(format_validation_error(validation_error))
        self.validation_error = validation_error


def edit_distance(a: str, b: str) -> int:
    """The number of one-character insertions, deletions, substitutions and swaps of two
    neighbours that turn ``a`` into ``b`` (optimal string alignment distance)."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, previous2[j - 2] + 1)
            current.append(cost)
        previous2, previous = previous, current
    return previous[-1]


def closest_key(key: str, choices: Iterable[str], fallback: Iterable[str] = ()) -> str | None:
    """Return the valid name closest to a mistyped one, or None when nothing is close.

    Closest by edit distance, within a third of the name's length (at least 2 edits). On a tie
    a choice beats a ``fallback`` name (accepted but without effect, like NVIDIA's resiliency
    extension's settings), then the name that comes first.

    Args:
        key: the mistyped name.
        choices: the valid names.
        fallback: names accepted but without effect.

    Returns:
        The closest name, or None.
    """
    limit = max(2, len(key) // 3)
    names = [*choices, *fallback]
    working = len(names) - len(list(fallback))
    scored = [
        (edit_distance(key, name), index >= working, index) for index, name in enumerate(names)
    ]
    close = [item for item in scored if item[0] <= limit]
    return names[min(close)[2]] if close else None


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
