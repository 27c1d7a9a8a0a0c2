"""The FT state file: calculated timeouts persisted between jobs as ``_ft_state.json``."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["FT_SECTIONS_STATE_FILE_NAME", "FT_STATE_FILE_NAME", "read_ft_state", "write_ft_state"]

FT_STATE_FILE_NAME = "_ft_state.json"
"""State file of ``FaultToleranceCallback`` (the name NVIDIA's resiliency extension uses)."""

FT_SECTIONS_STATE_FILE_NAME = "_ft_state_.json"
"""State file of ``FaultToleranceSectionsCallback``: NVIDIA's resiliency extension names it with
a trailing underscore; read and written under that name so a migrated job keeps its timeouts."""

_log = logging.getLogger(__name__)


def read_ft_state(path: Path) -> dict[str, Any] | None:
    """Read a state file written by :func:`write_ft_state`.

    A missing file is normal (the first job); an unreadable or malformed one is logged and ignored:
    stale timeouts must never stop a job from starting, which then runs with the configured ones.

    Args:
        path: The ``_ft_state.json`` file.

    Returns:
        The state dict (``{"current_timeouts": ...}``), or None.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        _log.warning("cannot read FT state file %s (%s); using the configured timeouts", path, exc)
        return None
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        _log.warning(
            "FT state file %s is not valid JSON (%s); using the configured timeouts", path, exc
        )
        return None
    if not isinstance(state, dict) or not isinstance(state.get("current_timeouts"), dict):
        _log.warning(
            "FT state file %s has no 'current_timeouts' mapping; using the configured timeouts",
            path,
        )
        return None
    return state


def write_ft_state(path: Path, state: dict[str, Any]) -> None:
    """Write the state atomically (a reader never sees a half-written file).

    Args:
        path: The ``_ft_state.json`` file; its directory is created if needed.
        state: The client's ``state_dict()``.

    Raises:
        OSError: The directory or file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(state, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
