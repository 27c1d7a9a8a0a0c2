"""Loading the ``fault_tolerance`` section of a YAML file, wherever it sits in the tree."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from resiliency.ft.errors import ConfigError, ConfigNotFoundError

logger = logging.getLogger(__name__)

SECTION_KEY = "fault_tolerance"
"""The YAML key under which the configuration lives."""


class EmptyConfigFileError(ConfigNotFoundError):
    """The config file holds nothing at all (no YAML document)."""


def load_section(path: str | os.PathLike[str], setting_names: Collection[str]) -> Any:
    """Read a YAML file and return the value of its single ``fault_tolerance`` key.

    Args:
        path: the YAML file.
        setting_names: the valid setting names, to spot settings written outside a section.

    Returns:
        The section's value (an empty dict when the section is empty); not yet validated.

    Raises:
        EmptyConfigFileError: the file holds no YAML document.
        ConfigNotFoundError: the file is missing, or it holds no ``fault_tolerance`` section.
        ConfigError: the file is unreadable or not YAML, or it holds several
            ``fault_tolerance`` sections.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigNotFoundError(
            f"fault-tolerance config file {file} does not exist; check the path "
            "(or pass --ignore-missing-fault-tol-cfg to run with defaults and flags)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read fault-tolerance config file {file}: {exc}") from exc
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"fault-tolerance config file {file} is not valid YAML: {exc}") from exc

    if tree is None:
        raise EmptyConfigFileError(
            f"fault-tolerance config file {file} is empty: it has no '{SECTION_KEY}' section"
        )
    found = list(_find_sections(tree, ()))
    if not found:
        hint = ""
        if isinstance(tree, Mapping) and any(key in setting_names for key in tree):
            hint = f"; its top-level keys look like settings: put them under a '{SECTION_KEY}:' key"
        raise ConfigNotFoundError(
            f"fault-tolerance config file {file} has no '{SECTION_KEY}' section "
            f"(looked for a '{SECTION_KEY}' key at any depth){hint}"
        )
    if len(found) > 1:
        where = ", ".join(_format_location(loc) for loc, _ in found)
        raise ConfigError(
            f"fault-tolerance config file {file} has {len(found)} '{SECTION_KEY}' sections "
            f"({where}); keep exactly one"
        )
    location, section = found[0]
    logger.debug("using the %s section of %s", _format_location(location), file)
    return {} if section is None else section


def _find_sections(
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
                yield from _find_sections(value, (*location, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _find_sections(value, (*location, index))


def _format_location(location: tuple[str | int, ...]) -> str:
    """Spell a location as ``a.b[2].fault_tolerance``."""
    parts = [f"[{part}]" if isinstance(part, int) else f".{part}" for part in location]
    return "".join(parts).lstrip(".")
