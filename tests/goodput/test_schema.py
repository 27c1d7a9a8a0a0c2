"""The event schema: per-type field validation and the generated reference."""

from __future__ import annotations

import pytest

from resiliency.goodput import EVENT_TYPES, SCHEMA_VERSION, render_schema_reference, validate_event
from resiliency.goodput.schema import validate_fields

from ._ledgers import line


def test_contract_event_types_and_version() -> None:
    assert isinstance(SCHEMA_VERSION, int) and SCHEMA_VERSION >= 1
    for name in (
        "job_scheduled",
        "job_started",
        "job_ended",
        "cycle_started",
        "cycle_ended",
        "hang_detected",
        "step",
        "checkpoint_save_started",
        "checkpoint_saved",
        "checkpoint_save_failed",
        "checkpoint_load_started",
        "checkpoint_loaded",
        "straggler_detected",
        "fault_injected",
        "preempted",
    ):
        assert name in EVENT_TYPES


@pytest.mark.parametrize(
    "event",
    [
        line("job_ended", 1, exit_code=0, reason="success"),
        line("cycle_ended", 1, cycle=2, cause="hang", timer="step", ranks=[1]),
        line("cycle_ended", 1, cycle=2, cause="crash"),
        line("hang_detected", 1, rank=1, timer="heartbeat", latency_s=0.2),
        line("hang_detected", 1, rank=1, timer="heartbeat", latency_s=0.2, timeout_s=5),
        line("checkpoint_saved", 1, step=3, tier="local", bytes=9, blocked_s=0, total_s=1.5),
        line("straggler_detected", 1, ranks=[3], scores={"3": 0.4}),
        {**line("step", 1, step=3), "rank": 0, "extra_field_from_a_newer_writer": 1},
    ],
)
def test_valid_events(event: dict) -> None:
    assert validate_event(event) is None


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        (line("job_ended", 1, exit_code=0), "job_ended: missing field 'reason'"),
        (line("job_ended", 1, exit_code=True, reason="x"), "field 'exit_code' must be int"),
        (line("cycle_ended", 1, cycle=0, cause="meteor"), "field 'cause' must be cause"),
        (
            line("checkpoint_saved", 1, step=3, tier="tape", bytes=9, blocked_s=0, total_s=1),
            "field 'tier' must be tier",
        ),
        (line("straggler_detected", 1, ranks=["a"], scores={}), "must be list[int]"),
        (line("nope", 1), "unknown event type 'nope'"),
        ({**line("step", 1, step=1), "attempt": "0"}, "field 'attempt' must be int"),
        ([1], "not a JSON object"),
    ],
)
def test_invalid_events(event, problem: str) -> None:
    assert problem in (validate_event(event) or "")


def test_validate_fields_only() -> None:
    assert validate_fields("step", {"step": 1}) is None
    assert validate_fields("step", {}) == "step: missing field 'step'"


def test_reference_lists_every_type_and_field() -> None:
    text = render_schema_reference()
    assert f"Schema version: **{SCHEMA_VERSION}**" in text
    for event, fields in EVENT_TYPES.items():
        assert f"| `{event}` |" in text
        for name in fields:
            assert f"`{name}`:" in text
