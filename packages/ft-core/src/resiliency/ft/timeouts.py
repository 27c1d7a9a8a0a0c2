"""Timeouts in effect, what the monitor observed, and how calculated timeouts are derived.

Everything here is pure: plain dataclasses and functions over numbers, no I/O. The client asks the
monitor for the observed intervals, reduces them across ranks, calls
:func:`calculate_heartbeat_timeouts` / :func:`calculate_section_timeouts`, and sends the result
back to the monitor.

A calculated timeout is ``longest observed interval x safety_factor``, merged by maximum with the
value calculated by an earlier job (loaded from a state dict), so timeouts only grow across jobs and
a quiet job never tightens them below what a busier one needed.

Saving and loading them across jobs is :mod:`resiliency.ft.state`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resiliency.ft.errors import StateDictError

if TYPE_CHECKING:
    from resiliency.ft.config import FaultToleranceConfig

__all__ = [
    "HeartbeatTimeouts",
    "ObservedIntervals",
    "SectionTimeouts",
    "calculate_heartbeat_timeouts",
    "calculate_section_timeouts",
]

# A calculated timeout is never below this, so an observed interval of zero (two events within the
# clock's resolution) cannot produce a timeout that fires at once.
_MIN_CALCULATED_TIMEOUT = 0.001


def _check_timeout(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StateDictError(f"{where} must be a number of seconds or null, got {value!r:.60}")
    if not math.isfinite(value) or value <= 0:
        raise StateDictError(f"{where} must be a positive finite number of seconds, got {value!r}")
    return float(value)


def _check_observed(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise StateDictError(f"{where} must be a finite number of seconds, got {value!r:.60}")
    if value < 0:
        raise StateDictError(f"{where} must not be negative, got {value!r}")
    return float(value)


def _check_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise StateDictError(f"{where} must be true or false, got {value!r:.60}")
    return value


def _check_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise StateDictError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class HeartbeatTimeouts:
    """The heartbeat timeouts in effect.

    Attributes:
        initial: Longest time from the rank's connection (``init_workload_monitoring()``) to
            its first heartbeat (None: no timeout).
        subsequent: Longest gap between heartbeats after the first one (None: no timeout).
        were_calculated: True when the values come from observed intervals, not the config.
    """

    initial: float | None = None
    subsequent: float | None = None
    were_calculated: bool = False

    @property
    def are_valid(self) -> bool:
        """True when both timeouts are set (not None), as in NVIDIA's resiliency extension."""
        return self.initial is not None and self.subsequent is not None

    @classmethod
    def from_config(cls, cfg: FaultToleranceConfig) -> HeartbeatTimeouts:
        """Return the configured heartbeat timeouts.

        Args:
            cfg: The fault-tolerance configuration.

        Returns:
            Timeouts that were not calculated.
        """
        return cls(cfg.initial_rank_heartbeat_timeout, cfg.rank_heartbeat_timeout, False)

    def to_dict(self) -> dict[str, Any]:
        """Return the state-dict form: ``{"initial", "subsequent", "were_calculated"}``."""
        return {
            "initial": self.initial,
            "subsequent": self.subsequent,
            "were_calculated": self.were_calculated,
        }

    @classmethod
    def from_dict(cls, data: Any) -> HeartbeatTimeouts:
        """Parse the state-dict form.

        Args:
            data: A mapping as written by :meth:`to_dict`.

        Returns:
            The timeouts.

        Raises:
            StateDictError: A key is missing or a value is invalid.
        """
        data = _check_mapping(data, "heartbeat timeouts")
        try:
            return cls(
                initial=_check_timeout(data["initial"], "heartbeat.initial"),
                subsequent=_check_timeout(data["subsequent"], "heartbeat.subsequent"),
                were_calculated=_check_bool(data["were_calculated"], "heartbeat.were_calculated"),
            )
        except KeyError as exc:
            raise StateDictError(f"heartbeat timeouts lack the key {exc.args[0]!r}") from None


@dataclass(frozen=True)
class SectionTimeouts:
    """The section timeouts in effect.

    Attributes:
        section: Timeout of each named section (None or absent: no timeout).
        out_of_section: Longest time with no section open (None: no timeout).
        calculated_sections: Names whose timeout was calculated from observed durations.
        is_out_of_section_calculated: True when ``out_of_section`` was calculated.
    """

    section: Mapping[str, float | None] = field(default_factory=dict)
    out_of_section: float | None = None
    calculated_sections: frozenset[str] = frozenset()
    is_out_of_section_calculated: bool = False

    @property
    def are_valid(self) -> bool:
        """True when every section timeout and the out-of-section timeout are set (not None)."""
        return self.out_of_section is not None and all(
            limit is not None for limit in self.section.values()
        )

    @property
    def were_calculated(self) -> bool:
        """True when every section's and the out-of-section timeout were calculated."""
        return self.is_out_of_section_calculated and set(self.section) <= self.calculated_sections

    @classmethod
    def from_config(cls, cfg: FaultToleranceConfig) -> SectionTimeouts:
        """Return the configured section timeouts.

        Args:
            cfg: The fault-tolerance configuration.

        Returns:
            Timeouts that were not calculated.
        """
        return cls(dict(cfg.rank_section_timeouts), cfg.rank_out_of_section_timeout)

    def limit_for(self, name: str) -> float | None:
        """Return the timeout of section ``name`` (None: not watched)."""
        return self.section.get(name)

    def to_dict(self) -> dict[str, Any]:
        """Return the state-dict form (calculated sections sorted, for stable files)."""
        return {
            "section": dict(self.section),
            "out_of_section": self.out_of_section,
            "calculated_sections": sorted(self.calculated_sections),
            "is_out_of_section_calculated": self.is_out_of_section_calculated,
        }

    @classmethod
    def from_dict(cls, data: Any) -> SectionTimeouts:
        """Parse the state-dict form.

        Args:
            data: A mapping as written by :meth:`to_dict`.

        Returns:
            The timeouts.

        Raises:
            StateDictError: A key is missing or a value is invalid.
        """
        data = _check_mapping(data, "section timeouts")
        try:
            raw_sections = _check_mapping(data["section"], "section.section")
            calculated = data["calculated_sections"]
            if not isinstance(calculated, (list, tuple)) or not all(
                isinstance(name, str) for name in calculated
            ):
                raise StateDictError("section.calculated_sections must be a list of names")
            sections = {}
            for name, value in raw_sections.items():
                if not isinstance(name, str):
                    raise StateDictError(f"section names must be strings, got {name!r:.60}")
                sections[name] = _check_timeout(value, f"section.section[{name!r}]")
            return cls(
                section=sections,
                out_of_section=_check_timeout(data["out_of_section"], "section.out_of_section"),
                calculated_sections=frozenset(calculated),
                is_out_of_section_calculated=_check_bool(
                    data["is_out_of_section_calculated"], "section.is_out_of_section_calculated"
                ),
            )
        except KeyError as exc:
            raise StateDictError(f"section timeouts lack the key {exc.args[0]!r}") from None


@dataclass(frozen=True)
class ObservedIntervals:
    """The longest intervals the monitor has observed for one local rank (seconds).

    Attributes:
        initial: From arming (worker spawn) to the first heartbeat or section start.
        heartbeat: Longest gap between two heartbeats.
        sections: Longest duration of each section, by name.
        out_of_section: Longest time with no section open, between two sections.
    """

    initial: float | None = None
    heartbeat: float | None = None
    sections: Mapping[str, float] = field(default_factory=dict)
    out_of_section: float | None = None

    def to_flat(self) -> dict[str, float]:
        """Return the observations as one flat mapping (for a cross-rank max reduction)."""
        flat = {f"section:{name}": value for name, value in self.sections.items()}
        for key in ("initial", "heartbeat", "out_of_section"):
            value = getattr(self, key)
            if value is not None:
                flat[key] = value
        return flat

    @classmethod
    def from_flat(cls, flat: Mapping[str, float]) -> ObservedIntervals:
        """Inverse of :meth:`to_flat`."""
        return cls(
            initial=flat.get("initial"),
            heartbeat=flat.get("heartbeat"),
            sections={
                key.removeprefix("section:"): value
                for key, value in flat.items()
                if key.startswith("section:")
            },
            out_of_section=flat.get("out_of_section"),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form used in the monitor's ``stats`` reply."""
        return {
            "initial": self.initial,
            "heartbeat": self.heartbeat,
            "sections": dict(self.sections),
            "out_of_section": self.out_of_section,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ObservedIntervals:
        """Parse the JSON form.

        Args:
            data: A mapping as written by :meth:`to_dict`.

        Returns:
            The observations.

        Raises:
            StateDictError: The mapping is malformed.
        """
        data = _check_mapping(data, "observed intervals")
        raw_sections = _check_mapping(data.get("sections", {}), "observed sections")
        sections: dict[str, float] = {}
        for name, value in raw_sections.items():
            duration = _check_observed(value, f"observed section {name!r}")
            if duration is not None:
                sections[str(name)] = duration
        return cls(
            initial=_check_observed(data.get("initial"), "observed initial"),
            heartbeat=_check_observed(data.get("heartbeat"), "observed heartbeat"),
            sections=sections,
            out_of_section=_check_observed(data.get("out_of_section"), "observed out_of_section"),
        )


def _grow(observed: float, safety_factor: float, earlier: float | None, floor: float) -> float:
    new = max(observed * safety_factor, floor, _MIN_CALCULATED_TIMEOUT)
    return new if earlier is None else max(new, earlier)


def calculate_heartbeat_timeouts(
    current: HeartbeatTimeouts,
    observed: ObservedIntervals,
    safety_factor: float,
    floor: float = 0.0,
) -> HeartbeatTimeouts:
    """Derive heartbeat timeouts from observed intervals.

    Each timeout with an observation becomes ``observed x safety_factor`` (at least ``floor``),
    or the earlier calculated value if that is larger. A timeout without an observation keeps
    its current value.

    Args:
        current: The timeouts in effect (config values, or calculated by an earlier job).
        observed: The longest intervals observed (already reduced across ranks).
        safety_factor: The multiplier (>= 1).
        floor: The smallest calculated timeout (``calculated_timeout_floor``).

    Returns:
        The new timeouts; ``current`` unchanged when nothing relevant was observed.
    """
    if observed.initial is None and observed.heartbeat is None:
        return current
    earlier_initial = current.initial if current.were_calculated else None
    earlier_subsequent = current.subsequent if current.were_calculated else None
    return HeartbeatTimeouts(
        initial=current.initial
        if observed.initial is None
        else _grow(observed.initial, safety_factor, earlier_initial, floor),
        subsequent=current.subsequent
        if observed.heartbeat is None
        else _grow(observed.heartbeat, safety_factor, earlier_subsequent, floor),
        were_calculated=True,
    )


def calculate_section_timeouts(
    current: SectionTimeouts,
    observed: ObservedIntervals,
    safety_factor: float,
    selected_sections: Iterable[str] | None = None,
    calc_out_of_section: bool = True,
    *,
    floor: float = 0.0,
) -> SectionTimeouts:
    """Derive section timeouts from observed durations.

    Args:
        current: The timeouts in effect.
        observed: The longest durations observed (already reduced across ranks).
        safety_factor: The multiplier (>= 1).
        selected_sections: Only these sections (default: every observed section).
        calc_out_of_section: Also calculate the out-of-section timeout.
        floor: The smallest calculated timeout (``calculated_timeout_floor``).

    Returns:
        The new timeouts. Sections that were not observed keep their current timeout.
    """
    wanted = set(observed.sections if selected_sections is None else selected_sections)
    sections = dict(current.section)
    calculated = set(current.calculated_sections)
    for name in sorted(wanted):
        duration = observed.sections.get(name)
        if duration is None:
            continue
        earlier = sections.get(name) if name in current.calculated_sections else None
        sections[name] = _grow(duration, safety_factor, earlier, floor)
        calculated.add(name)
    out_of_section = current.out_of_section
    oos_calculated = current.is_out_of_section_calculated
    if calc_out_of_section and observed.out_of_section is not None:
        earlier_oos = current.out_of_section if oos_calculated else None
        out_of_section = _grow(observed.out_of_section, safety_factor, earlier_oos, floor)
        oos_calculated = True
    return SectionTimeouts(sections, out_of_section, frozenset(calculated), oos_calculated)
