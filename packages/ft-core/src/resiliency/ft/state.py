"""Saving calculated timeouts with a checkpoint, and loading them in the next job.

The layout ``{"current_timeouts": {"heartbeat": {...}, "section": {...}}}`` is a compatibility
contract: saved ``_ft_state.json`` files stay interchangeable with the established tools.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from resiliency.ft.errors import StateDictError
from resiliency.ft.timeouts import HeartbeatTimeouts, SectionTimeouts, _check_mapping

__all__ = ["merge_loaded_timeouts", "timeouts_from_state_dict", "timeouts_to_state_dict"]

_STATE_KEY = "current_timeouts"


def merge_loaded_timeouts(
    configured_hb: HeartbeatTimeouts,
    configured_sections: SectionTimeouts,
    loaded_hb: HeartbeatTimeouts,
    loaded_sections: SectionTimeouts,
) -> tuple[HeartbeatTimeouts, SectionTimeouts]:
    """Combine timeouts loaded from a saved state with the configured ones.

    Calculated values from the state win; everything else comes from the current configuration,
    so a changed config still applies to whatever was never calculated.

    Args:
        configured_hb: Heartbeat timeouts from the current config.
        configured_sections: Section timeouts from the current config.
        loaded_hb: Heartbeat timeouts from the state dict.
        loaded_sections: Section timeouts from the state dict.

    Returns:
        The heartbeat and section timeouts to use.
    """
    hb = loaded_hb if loaded_hb.were_calculated else configured_hb
    sections = dict(configured_sections.section)
    for name in loaded_sections.calculated_sections:
        if name in loaded_sections.section:
            sections[name] = loaded_sections.section[name]
    calculated = frozenset(n for n in loaded_sections.calculated_sections if n in sections)
    if loaded_sections.is_out_of_section_calculated:
        merged = SectionTimeouts(sections, loaded_sections.out_of_section, calculated, True)
    else:
        merged = replace(configured_sections, section=sections, calculated_sections=calculated)
    return hb, merged


def timeouts_to_state_dict(
    hb: HeartbeatTimeouts, sections: SectionTimeouts
) -> dict[str, dict[str, Any]]:
    """Return ``{"current_timeouts": {"heartbeat": ..., "section": ...}}`` (JSON-able).

    Args:
        hb: The heartbeat timeouts.
        sections: The section timeouts.

    Returns:
        The state dict.
    """
    return {_STATE_KEY: {"heartbeat": hb.to_dict(), "section": sections.to_dict()}}


def timeouts_from_state_dict(state: Any) -> tuple[HeartbeatTimeouts, SectionTimeouts]:
    """Parse a state dict written by :func:`timeouts_to_state_dict`.

    Args:
        state: The state dict (e.g. ``json.load`` of a saved ``_ft_state.json``).

    Returns:
        The heartbeat and section timeouts it holds.

    Raises:
        StateDictError: The layout or a value is invalid.
    """
    state = _check_mapping(state, "the fault-tolerance state dict")
    if _STATE_KEY not in state:
        raise StateDictError(
            f"the fault-tolerance state dict has no {_STATE_KEY!r} key (keys: {list(state)!r:.200})"
        )
    current = _check_mapping(state[_STATE_KEY], _STATE_KEY)
    for key in ("heartbeat", "section"):
        if key not in current:
            raise StateDictError(f"{_STATE_KEY} lacks the key {key!r}")
    return HeartbeatTimeouts.from_dict(current["heartbeat"]), SectionTimeouts.from_dict(
        current["section"]
    )
