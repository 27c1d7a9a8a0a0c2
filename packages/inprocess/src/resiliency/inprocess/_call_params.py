"""Which parameters of the wrapped function ask for the current ``CallWrapper``."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any


def params_annotated(fn: Callable[..., Any], cls: type) -> list[str]:
    """Names of ``fn``'s parameters annotated ``cls`` or ``Optional[cls]`` (also as strings)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back on the raw ones
        hints = getattr(fn, "__annotations__", {})
    name = cls.__name__
    as_text = (name, f"Optional[{name}]", f"{name} | None")
    names = []
    for param, hint in hints.items():
        if param == "return":
            continue
        options = typing.get_args(hint) or (hint,)
        if any(opt is cls or opt == name for opt in options) or hint in as_text:
            names.append(param)
    return names
