"""Saving calculated timeouts with a checkpoint, and loading them in the next job.

The layout ``{"current_timeouts": {"heartbeat": {...}, "section": {...}}}`` is a compatibility
contract: saved ``_ft_state.json`` files stay interchangeable with the established tools.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any

from resiliency.ft._durations import format_limit
from resiliency.ft.errors import StateDictError
from resiliency.ft.timeouts import HeartbeatTimeouts, SectionTimeouts, _check_mapping

__all__ = [
    "describe_loaded_timeouts",
    "merge_loaded_timeouts",
    "timeouts_from_state_dict",
    "timeouts_to_state_dict",
]

_STATE_KEY = "current_timeouts"


def merge_loaded_timeouts(
    configured_hb: HeartbeatTimeouts,
    configured_sections: SectionTimeouts,
    loaded_hb: HeartbeatTimeouts,
    loaded_sections: SectionTimeouts,
    floor: float = 0.0,
) -> tuple[HeartbeatTimeouts, SectionTimeouts]:
    """Combine timeouts loaded from a saved state with the configured ones.

    Calculated values from the state win, raised to ``floor`` when below it (a state saved by a
    short run, or by a tool without a floor); everything else comes from the current
    configuration, so a changed config still applies to whatever was never calculated.
    :func:`describe_loaded_timeouts` says what this changed.

    Args:
        configured_hb: Heartbeat timeouts from the current config.
        configured_sections: Section timeouts from the current config.
        loaded_hb: Heartbeat timeouts from the state dict.
        loaded_sections: Section timeouts from the state dict.
        floor: ``calculated_timeout_floor``.

    Returns:
        The heartbeat and section timeouts to use.
    """

    def floored(value: float | None) -> float | None:
        return None if value is None else max(value, floor)

    hb = configured_hb
    if loaded_hb.were_calculated:
        hb = replace(
            loaded_hb, initial=floored(loaded_hb.initial), subsequent=floored(loaded_hb.subsequent)
        )
    sections = dict(configured_sections.section)
    for name in loaded_sections.calculated_sections:
        if name in loaded_sections.section:
            sections[name] = floored(loaded_sections.section[name])
    calculated = frozenset(n for n in loaded_sections.calculated_sections if n in sections)
    if loaded_sections.is_out_of_section_calculated:
        oos = floored(loaded_sections.out_of_section)
        merged = SectionTimeouts(sections, oos, calculated, True)
    else:
        merged = replace(configured_sections, section=sections, calculated_sections=calculated)
    return hb, merged


def describe_loaded_timeouts(
    explicit: AbstractSet[str],
    configured: tuple[HeartbeatTimeouts, SectionTimeouts],
    loaded: tuple[HeartbeatTimeouts, SectionTimeouts],
    used: tuple[HeartbeatTimeouts, SectionTimeouts],
    floor: float,
) -> list[str]:
    """Say which loaded values were raised to the floor, and which replace an explicit setting.

    Args:
        explicit: The configuration keys set explicitly (``cfg.model_fields_set``: a flag, the
            config file or a keyword argument), as opposed to defaults.
        configured: The configured heartbeat and section timeouts.
        loaded: The ones read from the state dict.
        used: What :func:`merge_loaded_timeouts` made of them.
        floor: ``calculated_timeout_floor``.

    Returns:
        One phrase per changed key, e.g. ``rank_heartbeat_timeout: 60 s (saved 0.252 s, raised
        to the floor 60 s) replaces the configured 5 s``; empty when nothing changed.
    """
    (c_hb, c_sec), (l_hb, l_sec), (u_hb, u_sec) = configured, loaded, used
    rows: list[tuple[str, bool, float | None, float | None, float | None]] = []
    if l_hb.were_calculated:
        rows.append(
            ("initial_rank_heartbeat_timeout", True, c_hb.initial, l_hb.initial, u_hb.initial)
        )
        rows.append(
            ("rank_heartbeat_timeout", True, c_hb.subsequent, l_hb.subsequent, u_hb.subsequent)
        )
    for name in sorted(u_sec.calculated_sections):
        key = f"rank_section_timeouts[{name}]"
        was_set = name in c_sec.section  # a default config has no section timeouts at all
        rows.append(
            (
                key,
                was_set,
                c_sec.section.get(name),
                l_sec.section.get(name),
                u_sec.section.get(name),
            )
        )
    if l_sec.is_out_of_section_calculated:
        oos = (c_sec.out_of_section, l_sec.out_of_section, u_sec.out_of_section)
        rows.append(("rank_out_of_section_timeout", True, *oos))
    notes = []
    for key, was_set, conf, saved, value in rows:
        field = key.split("[", 1)[0]
        raised = saved is not None and value != saved
        overrides = field in explicit and was_set and value != conf
        if not raised and not overrides:
            continue
        note = f"{key}: {format_limit(value)}"
        if raised:
            note += f" (saved {format_limit(saved)}, raised to the floor {format_limit(floor)})"
        if overrides:
            note += f" replaces the configured {format_limit(conf)}"
        notes.append(note)
    return notes


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
