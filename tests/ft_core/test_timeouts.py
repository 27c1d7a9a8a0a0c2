"""The pure timeout functions and the state-dict layout."""

from __future__ import annotations

import json

import pytest

from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.errors import StateDictError
from resiliency.ft.state import (
    merge_loaded_timeouts,
    timeouts_from_state_dict,
    timeouts_to_state_dict,
)
from resiliency.ft.timeouts import (
    HeartbeatTimeouts,
    ObservedIntervals,
    SectionTimeouts,
    calculate_heartbeat_timeouts,
    calculate_section_timeouts,
)


def test_heartbeat_timeouts_are_observed_max_times_safety_factor():
    current = HeartbeatTimeouts(3600.0, 2700.0, False)
    observed = ObservedIntervals(initial=10.0, heartbeat=2.0)
    new = calculate_heartbeat_timeouts(current, observed, 5.0)
    assert new == HeartbeatTimeouts(50.0, 10.0, True)


def test_heartbeat_timeouts_merge_with_earlier_calculated_values_by_max():
    earlier = HeartbeatTimeouts(50.0, 10.0, True)
    assert calculate_heartbeat_timeouts(earlier, ObservedIntervals(4.0, 1.0), 5.0) == earlier
    grown = calculate_heartbeat_timeouts(earlier, ObservedIntervals(20.0, 1.0), 5.0)
    assert grown == HeartbeatTimeouts(100.0, 10.0, True)


def test_config_values_are_replaced_not_merged():
    # Config values (were_calculated False) are an upper bound chosen blindly; calculation
    # replaces them even when they are larger.
    current = HeartbeatTimeouts(3600.0, 2700.0, False)
    assert calculate_heartbeat_timeouts(current, ObservedIntervals(1.0, 1.0), 2.0).subsequent == 2.0


def test_nothing_observed_keeps_heartbeat_timeouts():
    current = HeartbeatTimeouts(3600.0, 2700.0, False)
    assert calculate_heartbeat_timeouts(current, ObservedIntervals(), 5.0) is current


def test_missing_observation_keeps_that_timeout():
    current = HeartbeatTimeouts(3600.0, None, False)
    new = calculate_heartbeat_timeouts(current, ObservedIntervals(initial=2.0), 5.0)
    assert new == HeartbeatTimeouts(10.0, None, True)


def test_zero_observation_never_gives_a_zero_timeout():
    new = calculate_heartbeat_timeouts(HeartbeatTimeouts(), ObservedIntervals(0.0, 0.0), 5.0)
    assert new.initial and new.initial > 0
    assert new.subsequent and new.subsequent > 0


def test_section_timeouts_calculation_and_merge():
    current = SectionTimeouts({"step": 600.0, "ckpt": None, "eval": 60.0}, None)
    observed = ObservedIntervals(sections={"step": 2.0, "ckpt": 30.0}, out_of_section=1.0)
    first = calculate_section_timeouts(current, observed, 3.0)
    assert first.section == {"step": 6.0, "ckpt": 90.0, "eval": 60.0}
    assert first.calculated_sections == {"step", "ckpt"}
    assert first.out_of_section == 3.0 and first.is_out_of_section_calculated
    second = calculate_section_timeouts(
        first, ObservedIntervals(sections={"step": 5.0, "ckpt": 1.0}, out_of_section=0.5), 3.0
    )
    assert second.section == {"step": 15.0, "ckpt": 90.0, "eval": 60.0}
    assert second.out_of_section == 3.0


def test_section_selection_and_out_of_section_flag():
    current = SectionTimeouts({"step": 600.0}, 100.0)
    observed = ObservedIntervals(sections={"step": 2.0, "ckpt": 30.0}, out_of_section=1.0)
    new = calculate_section_timeouts(current, observed, 2.0, ["ckpt"], calc_out_of_section=False)
    assert new.section == {"step": 600.0, "ckpt": 60.0}
    assert new.calculated_sections == {"ckpt"}
    assert new.out_of_section == 100.0 and not new.is_out_of_section_calculated


def test_state_dict_layout_is_the_compatibility_contract():
    hb = HeartbeatTimeouts(50.0, 10.0, True)
    sections = SectionTimeouts({"step": 6.0, "ckpt": None}, 3.0, frozenset({"step"}), True)
    state = timeouts_to_state_dict(hb, sections)
    assert state == {
        "current_timeouts": {
            "heartbeat": {"initial": 50.0, "subsequent": 10.0, "were_calculated": True},
            "section": {
                "section": {"step": 6.0, "ckpt": None},
                "out_of_section": 3.0,
                "calculated_sections": ["step"],
                "is_out_of_section_calculated": True,
            },
        }
    }
    assert timeouts_from_state_dict(json.loads(json.dumps(state))) == (hb, sections)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.pop("current_timeouts"), "no 'current_timeouts' key"),
        (lambda s: s["current_timeouts"].pop("section"), "lacks the key 'section'"),
        (lambda s: s["current_timeouts"]["heartbeat"].pop("initial"), "lack the key 'initial'"),
        (
            lambda s: s["current_timeouts"]["heartbeat"].update(subsequent=-1),
            "heartbeat.subsequent must be a positive",
        ),
        (
            lambda s: s["current_timeouts"]["heartbeat"].update(were_calculated="yes"),
            "were_calculated must be true or false",
        ),
        (
            lambda s: s["current_timeouts"]["section"]["section"].update(step="x"),
            "section.section['step'] must be a number",
        ),
        (
            lambda s: s["current_timeouts"]["section"].update(calculated_sections="step"),
            "calculated_sections must be a list",
        ),
        (lambda s: s.update(current_timeouts=[]), "current_timeouts must be a mapping"),
    ],
)
def test_malformed_state_dicts_are_clear_errors(mutate, message):
    state = timeouts_to_state_dict(
        HeartbeatTimeouts(1.0, 2.0, True), SectionTimeouts({"step": 1.0})
    )
    mutate(state)
    with pytest.raises(StateDictError, match=message.replace("[", r"\[").replace("]", r"\]")):
        timeouts_from_state_dict(state)


def test_loaded_calculated_values_win_config_supplies_the_rest():
    cfg = FaultToleranceConfig(
        rank_section_timeouts={"step": 600.0, "eval": 60.0}, rank_out_of_section_timeout=100.0
    )
    loaded_hb = HeartbeatTimeouts(50.0, 10.0, True)
    loaded_sections = SectionTimeouts(
        {"step": 6.0, "eval": 1.0, "gone": 9.0}, 3.0, frozenset({"step", "gone"}), False
    )
    hb, sections = merge_loaded_timeouts(
        HeartbeatTimeouts.from_config(cfg),
        SectionTimeouts.from_config(cfg),
        loaded_hb,
        loaded_sections,
    )
    assert hb == loaded_hb
    assert sections.section == {"step": 6.0, "eval": 60.0, "gone": 9.0}
    assert sections.calculated_sections == {"step", "gone"}
    assert sections.out_of_section == 100.0 and not sections.is_out_of_section_calculated
    not_calculated = HeartbeatTimeouts(1.0, 1.0, False)
    hb2, _ = merge_loaded_timeouts(
        HeartbeatTimeouts.from_config(cfg), SectionTimeouts(), not_calculated, SectionTimeouts()
    )
    assert hb2 == HeartbeatTimeouts(3600.0, 2700.0, False)


def test_observed_intervals_flatten_for_the_cross_rank_reduction():
    observed = ObservedIntervals(1.0, 2.0, {"step": 3.0, "a:b": 4.0}, None)
    flat = observed.to_flat()
    assert flat == {"initial": 1.0, "heartbeat": 2.0, "section:step": 3.0, "section:a:b": 4.0}
    assert ObservedIntervals.from_flat(flat) == observed
    assert ObservedIntervals.from_dict(observed.to_dict()) == observed
    with pytest.raises(StateDictError):
        ObservedIntervals.from_dict({"sections": {"x": -1.0}})
