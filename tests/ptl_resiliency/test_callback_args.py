"""Argument checking, the exception policy helper, the FT state file and Lightning compatibility."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning.pytorch as lp
import pytest

from resiliency.ft import WorkloadAction
from resiliency.ptl import (
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    SimulatedFaultParams,
    StragglerDetectionCallback,
    shutdown_on,
)
from resiliency.ptl.ft_state import read_ft_state, write_ft_state

STRAGGLER_OK = {
    "report_time_interval": 1.0,
    "calc_relative_gpu_perf": True,
    "calc_individual_gpu_perf": True,
    "num_gpu_perf_scores_to_log": 3,
    "gpu_relative_perf_threshold": 0.75,
    "gpu_individual_perf_threshold": 0.75,
    "stop_if_detected": False,
    "enable_ptl_logging": True,
}


def test_simulated_fault_params_from_mapping() -> None:
    params = SimulatedFaultParams.coerce(
        {"fault_type": "rank_hung", "base_delay": 2, "rand_delay": 1.5, "rank_to_fail": 1}
    )
    assert params == SimulatedFaultParams("rank_hung", 2, 1.5, 1)
    assert SimulatedFaultParams.coerce(None) is None
    assert SimulatedFaultParams.coerce(params) is params


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"fault_type": "rank_crashed", "base_delay": 1}, "fault_type must be one of"),
        ({"fault_type": "rank_hung", "base_delay": -1}, "base_delay must be a number >= 0"),
        ({"fault_type": "rank_hung", "base_delay": 1, "rand_delay": "2"}, "rand_delay"),
        ({"fault_type": "rank_hung", "base_delay": 1, "rank_to_fail": True}, "rank_to_fail"),
        ({"fault_type": "rank_hung", "base_delay": 1, "rank": 0}, "unknown simulated_fault_params"),
        ({"base_delay": 1}, "needs 'fault_type'"),
        ([("fault_type", "rank_hung")], "must be a SimulatedFaultParams"),
    ],
)
def test_bad_simulated_fault_params(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FaultToleranceCallback(
            autoresume=False, calculate_timeouts=False, simulated_fault_params=value
        )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("report_time_interval", 0, "report_time_interval must be a positive"),
        ("report_time_interval", float("inf"), "report_time_interval must be a positive"),
        ("num_gpu_perf_scores_to_log", -1, "num_gpu_perf_scores_to_print must be an int"),
        ("num_gpu_perf_scores_to_log", 2.5, "num_gpu_perf_scores_to_print must be an int"),
        ("gpu_relative_perf_threshold", 1.5, r"gpu_relative_perf_threshold must be in \[0, 1\]"),
        ("gpu_individual_perf_threshold", float("nan"), "gpu_individual_perf_threshold must be"),
    ],
)
def test_bad_straggler_arguments(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StragglerDetectionCallback(**{**STRAGGLER_OK, key: value})  # type: ignore[arg-type]


def test_straggler_needs_a_score_kind() -> None:
    with pytest.raises(ValueError, match="nothing to compute"):
        StragglerDetectionCallback(
            **{**STRAGGLER_OK, "calc_relative_gpu_perf": False, "calc_individual_gpu_perf": False}
        )


def test_shutdown_on_policy() -> None:
    policy = shutdown_on(RuntimeError, KeyError)
    request = policy(RuntimeError("bad shard"))
    assert request is not None
    assert request.action is WorkloadAction.ShutdownWorkload
    assert "RuntimeError: bad shard" in request.description
    assert policy(ValueError("transient")) is None
    with pytest.raises(ValueError, match="at least one exception type"):
        shutdown_on()
    with pytest.raises(ValueError, match="must be callable"):
        FaultToleranceSectionsCallback(False, False, exc_handling_policy=42)  # type: ignore[arg-type]


def test_callbacks_fit_both_lightning_import_paths() -> None:
    callbacks = [
        FaultToleranceCallback(autoresume=False, calculate_timeouts=False),
        FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=False),
        StragglerDetectionCallback(**STRAGGLER_OK),
    ]
    for cb in callbacks:
        assert isinstance(cb, lp.Callback)
    pl = pytest.importorskip("pytorch_lightning")
    for cb in callbacks:
        assert isinstance(cb, pl.Callback)


def test_ft_state_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "ft_state" / "_ft_state.json"
    assert read_ft_state(path) is None
    state = {"current_timeouts": {"heartbeat": {"initial": 3.0}}}
    write_ft_state(path, state)
    assert read_ft_state(path) == state
    assert [p.name for p in path.parent.iterdir()] == ["_ft_state.json"]


@pytest.mark.parametrize(
    ("content", "message"), [("{not json", "not valid JSON"), ("[1, 2]", "no 'current_timeouts'")]
)
def test_bad_ft_state_file_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, message: str
) -> None:
    path = tmp_path / "_ft_state.json"
    path.write_text(content)
    with caplog.at_level(logging.WARNING):
        assert read_ft_state(path) is None
    assert message in caplog.text
    assert str(path) in caplog.text
    json.dumps(caplog.text)  # the message is plain text
