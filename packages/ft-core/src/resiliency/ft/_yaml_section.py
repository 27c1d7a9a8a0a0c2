"""Finding the ``fault_tolerance`` section in a parsed YAML tree."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

SECTION_KEY = "fault_tolerance"


def find_sections(
    node: Any, location: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Yield (location, value) of every ``fault_tolerance`` key, depth first.

    The search goes through mappings and lists and does not descend into a found section.
    """
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == SECTION_KEY:
                yield (*location, key), value
            else:
                yield from find_sections(value, (*location, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from find_sections(value, (*location, index))


def format_location(location: tuple[str | int, ...]) -> str:
    """Spell a location as ``a.b[2].fault_tolerance``."""
    parts = [f"[{part}]" if isinstance(part, int) else f".{part}" for part in location]
    return "".join(parts).lstrip(".")
