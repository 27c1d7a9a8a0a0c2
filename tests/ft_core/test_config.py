"""FaultToleranceConfig: defaults, validation, typo messages, YAML and JSON round trips."""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from resiliency.ft import (
    ConfigError,
    ConfigNotFoundError,
    FaultToleranceConfig,
    add_ft_arguments,
    config_from_args,
)
from resiliency.ft._config_reference import render_config_reference

REPO_ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- defaults and accepted spellings --------------------------------------------------------------


def test_defaults_are_the_documented_ones() -> None:
    cfg = FaultToleranceConfig()
    assert cfg.workload_check_interval == 5.0
    assert cfg.initial_rank_heartbeat_timeout == 3600.0
    assert cfg.rank_heartbeat_timeout == 2700.0
    assert cfg.rank_section_timeouts == {}
    assert cfg.rank_out_of_section_timeout is None
    assert cfg.node_health_check_interval == 5.0
    assert cfg.safety_factor == 5.0
    assert cfg.rank_termination_signal is signal.SIGTERM
    assert cfg.log_level == logging.INFO
    assert cfg.enable_stack_dump is True
    assert cfg.stack_dump_signal is signal.SIGUSR2
    assert cfg.stack_dump_timeout == 2.0
    assert cfg.termination_grace_period == 5.0


def test_default_section_timeouts_are_not_shared_between_instances() -> None:
    first = FaultToleranceConfig()
    first.rank_section_timeouts["step"] = 3.0
    assert FaultToleranceConfig().rank_section_timeouts == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("SIGTERM", signal.SIGTERM),
        ("TERM", signal.SIGTERM),
        ("sigkill", signal.SIGKILL),
        (" int ", signal.SIGINT),
        (15, signal.SIGTERM),
        ("9", signal.SIGKILL),
        (signal.SIGKILL, signal.SIGKILL),
    ],
)
def test_signal_spellings(value: object, expected: signal.Signals) -> None:
    assert FaultToleranceConfig(rank_termination_signal=value).rank_termination_signal is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("INFO", 20), ("debug", 10), ("Warning", 30), (20, 20), ("15", 15), (0, 0)],
)
def test_log_level_spellings(value: object, expected: int) -> None:
    assert FaultToleranceConfig(log_level=value).log_level == expected


def test_optional_timeouts_accept_none_and_numbers() -> None:
    cfg = FaultToleranceConfig(
        initial_rank_heartbeat_timeout=None,
        rank_heartbeat_timeout=10,
        rank_out_of_section_timeout="7.5",
        rank_section_timeouts={"step": 30, "checkpoint": None},
        termination_grace_period=0,
    )
    assert cfg.initial_rank_heartbeat_timeout is None
    assert cfg.rank_heartbeat_timeout == 10.0
    assert cfg.rank_out_of_section_timeout == 7.5
    assert cfg.rank_section_timeouts == {"step": 30.0, "checkpoint": None}
    assert cfg.termination_grace_period == 0.0


def test_same_signal_for_dump_and_termination_is_fine_without_stack_dump() -> None:
    cfg = FaultToleranceConfig(enable_stack_dump=False, stack_dump_signal="SIGTERM")
    assert cfg.stack_dump_signal is signal.SIGTERM


# -- validation errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"workload_check_interval": 0}, "workload_check_interval: Input should be greater than 0"),
        ({"workload_check_interval": -1.5}, "workload_check_interval"),
        ({"workload_check_interval": None}, "workload_check_interval"),
        ({"initial_rank_heartbeat_timeout": 0}, "initial_rank_heartbeat_timeout"),
        ({"initial_rank_heartbeat_timeout": -3}, "initial_rank_heartbeat_timeout"),
        ({"rank_heartbeat_timeout": -1}, "rank_heartbeat_timeout"),
        ({"rank_out_of_section_timeout": 0}, "rank_out_of_section_timeout"),
        ({"node_health_check_interval": 0}, "node_health_check_interval"),
        ({"stack_dump_timeout": 0}, "stack_dump_timeout"),
        ({"termination_grace_period": -0.1}, "termination_grace_period"),
        ({"rank_section_timeouts": {"step": 0}}, "rank_section_timeouts['step']"),
        ({"rank_section_timeouts": {"step": -2}}, "rank_section_timeouts['step']"),
        ({"rank_section_timeouts": ["step"]}, "rank_section_timeouts"),
        ({"safety_factor": 0.99}, "safety_factor: safety_factor must be >= 1, got 0.99"),
        ({"safety_factor": 0}, "safety_factor"),
        ({"safety_factor": math.nan}, "safety_factor"),
        ({"rank_heartbeat_timeout": math.inf}, "rank_heartbeat_timeout"),
        ({"rank_heartbeat_timeout": "soon"}, "rank_heartbeat_timeout"),
        ({"safety_factor": True}, "got the boolean True"),
        ({"rank_termination_signal": "SIGFOO"}, "unknown signal 'SIGFOO'"),
        ({"rank_termination_signal": 9999}, "9999 is not a signal number"),
        ({"rank_termination_signal": 1.5}, "rank_termination_signal"),
        ({"stack_dump_signal": "SIGKILL"}, "cannot be caught"),
        ({"stack_dump_signal": "SIGTERM"}, "both SIGTERM"),
        ({"log_level": "verbose"}, "unknown log level 'verbose'"),
        ({"log_level": -10}, "must not be negative"),
        ({"enable_stack_dump": "perhaps"}, "enable_stack_dump"),
    ],
)
def test_invalid_values_are_config_errors_naming_the_field(
    kwargs: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig(**kwargs)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_signal_name_suggests_the_closest_one() -> None:
    with pytest.raises(ConfigError, match="did you mean 'SIGTERM'"):
        FaultToleranceConfig(rank_termination_signal="SIGTREM")


def test_typo_in_kwargs_names_the_closest_key() -> None:
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig(rank_heartbeat_timout=10)
    assert "unknown key 'rank_heartbeat_timout'; did you mean 'rank_heartbeat_timeout'?" in str(
        info.value
    )


def test_every_unknown_key_is_reported() -> None:
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig(safety_facter=2, workload_chek_interval=1)
    message = str(info.value)
    assert "did you mean 'safety_factor'" in message
    assert "did you mean 'workload_check_interval'" in message


def test_a_setting_only_nvidias_tool_has_is_accepted_with_a_warning(caplog, monkeypatch) -> None:
    monkeypatch.setattr("resiliency.ft._nvrx_keys._warned", set())  # once per process and key
    # Issue 10: NVRx 0.4.x keys for features this toolkit lacks are accepted and ignored, with a
    # warning that names them (formerly an error).
    with caplog.at_level("WARNING", logger="resiliency.ft.config"):
        cfg = FaultToleranceConfig(restart_check_interval=60, safety_factor=2)
    assert cfg.safety_factor == 2
    assert "restart_check_interval" in caplog.text and "no effect here" in caplog.text


def test_unknown_key_without_close_match_lists_valid_keys() -> None:
    with pytest.raises(ConfigError, match="valid keys are: workload_check_interval, "):
        FaultToleranceConfig(colour="blue")


def test_assignment_is_validated_and_keeps_the_old_value() -> None:
    cfg = FaultToleranceConfig()
    cfg.safety_factor = 2
    assert cfg.safety_factor == 2.0
    with pytest.raises(ConfigError, match="safety_factor"):
        cfg.safety_factor = 0.5
    assert cfg.safety_factor == 2.0
    cfg.rank_termination_signal = "KILL"
    assert cfg.rank_termination_signal is signal.SIGKILL


def test_assignment_to_unknown_attribute_names_the_closest_key() -> None:
    cfg = FaultToleranceConfig()
    with pytest.raises(ConfigError, match="did you mean 'safety_factor'"):
        cfg.safty_factor = 3


def test_from_dict_rejects_a_non_mapping() -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        FaultToleranceConfig.from_dict([1, 2])  # type: ignore[arg-type]


# -- YAML -----------------------------------------------------------------------------------------


def test_yaml_section_at_top_level(tmp_path: Path) -> None:
    path = write(
        tmp_path / "ft.yaml",
        "fault_tolerance:\n  rank_heartbeat_timeout: 60\n  rank_termination_signal: SIGINT\n",
    )
    cfg = FaultToleranceConfig.from_yaml_file(path)
    assert cfg.rank_heartbeat_timeout == 60.0
    assert cfg.rank_termination_signal is signal.SIGINT
    assert cfg.safety_factor == 5.0


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_yaml_section_nested_at_any_depth(tmp_path: Path, depth: int) -> None:
    section: dict[str, object] = {"fault_tolerance": {"safety_factor": 2.5}}
    for level in range(depth):
        section = {f"level{level}": section, f"other{level}": {"unrelated": level}}
    path = tmp_path / "nested.yaml"
    path.write_text(yaml.safe_dump(section), encoding="utf-8")
    assert FaultToleranceConfig.from_yaml_file(path).safety_factor == 2.5


def test_yaml_section_inside_a_list(tmp_path: Path) -> None:
    path = write(
        tmp_path / "trainer.yaml",
        "trainer:\n  callbacks:\n    - name: other\n    - name: ft\n"
        "      fault_tolerance:\n        rank_section_timeouts: {step: 30, ckpt: null}\n",
    )
    cfg = FaultToleranceConfig.from_yaml_file(str(path))
    assert cfg.rank_section_timeouts == {"step": 30.0, "ckpt": None}


def test_empty_yaml_section_means_defaults(tmp_path: Path) -> None:
    path = write(tmp_path / "ft.yaml", "model: {}\nfault_tolerance:\n")
    assert FaultToleranceConfig.from_yaml_file(path) == FaultToleranceConfig()


def test_missing_yaml_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigNotFoundError) as info:
        FaultToleranceConfig.from_yaml_file(path)
    assert str(path) in str(info.value)
    assert "does not exist" in str(info.value)


def test_yaml_file_without_the_section_is_a_clear_error(tmp_path: Path) -> None:
    path = write(tmp_path / "train.yaml", "model:\n  layers: 4\noptimizer: {lr: 0.1}\n")
    with pytest.raises(ConfigNotFoundError) as info:
        FaultToleranceConfig.from_yaml_file(path)
    message = str(info.value)
    assert str(path) in message
    assert "no 'fault_tolerance' section" in message
    assert "at any depth" in message


def test_bare_settings_mapping_gets_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path / "bare.yaml", "rank_heartbeat_timeout: 60\n")
    with pytest.raises(ConfigNotFoundError, match="put them under a 'fault_tolerance:' key"):
        FaultToleranceConfig.from_yaml_file(path)


def test_empty_yaml_file_has_no_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigNotFoundError):
        FaultToleranceConfig.from_yaml_file(write(tmp_path / "empty.yaml", ""))


def test_two_sections_are_ambiguous(tmp_path: Path) -> None:
    path = write(
        tmp_path / "two.yaml",
        "a:\n  fault_tolerance: {safety_factor: 2}\nb:\n  - fault_tolerance: {safety_factor: 3}\n",
    )
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig.from_yaml_file(path)
    assert "a.fault_tolerance" in str(info.value)
    assert "b[0].fault_tolerance" in str(info.value)


def test_section_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path / "list.yaml", "fault_tolerance: [1, 2]\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        FaultToleranceConfig.from_yaml_file(path)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.yaml", "fault_tolerance: {safety_factor: [\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml is not valid YAML"):
        FaultToleranceConfig.from_yaml_file(path)


def test_unreadable_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        FaultToleranceConfig.from_yaml_file(tmp_path)


def test_typo_in_yaml_names_the_file_and_the_closest_key(tmp_path: Path) -> None:
    path = write(tmp_path / "typo.yaml", "job:\n  fault_tolerance:\n    rank_heartbeat_timout: 5\n")
    with pytest.raises(ConfigError) as info:
        FaultToleranceConfig.from_yaml_file(path)
    message = str(info.value)
    assert message.startswith(str(path))
    assert "did you mean 'rank_heartbeat_timeout'?" in message


def test_invalid_value_in_yaml_names_the_file_and_field(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "fault_tolerance:\n  safety_factor: 0.5\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: .*safety_factor"):
        FaultToleranceConfig.from_yaml_file(path)


def _custom_config() -> FaultToleranceConfig:
    return FaultToleranceConfig(
        workload_check_interval=0.5,
        initial_rank_heartbeat_timeout=None,
        rank_heartbeat_timeout=12.5,
        rank_section_timeouts={"step": 3.0, "checkpoint": None},
        rank_out_of_section_timeout=7,
        safety_factor=1.5,
        rank_termination_signal="SIGINT",
        log_level="DEBUG",
        enable_stack_dump=False,
        stack_dump_signal="SIGUSR1",
        stack_dump_timeout=0.25,
        termination_grace_period=0,
    )


def test_yaml_file_round_trip(tmp_path: Path) -> None:
    cfg = _custom_config()
    path = tmp_path / "out.yaml"
    cfg.to_yaml_file(path)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert list(raw) == ["fault_tolerance"]
    assert raw["fault_tolerance"]["rank_termination_signal"] == "SIGINT"
    assert raw["fault_tolerance"]["log_level"] == "DEBUG"
    assert raw["fault_tolerance"]["initial_rank_heartbeat_timeout"] is None
    assert FaultToleranceConfig.from_yaml_file(path) == cfg


def test_to_yaml_file_into_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot write"):
        FaultToleranceConfig().to_yaml_file(tmp_path / "no" / "such" / "dir.yaml")


# -- JSON (how the monitor process receives its config) -------------------------------------------


def test_json_round_trip_uses_names() -> None:
    cfg = _custom_config()
    data = json.loads(cfg.to_json())
    assert data["rank_termination_signal"] == "SIGINT"
    assert data["stack_dump_signal"] == "SIGUSR1"
    assert data["log_level"] == "DEBUG"
    assert FaultToleranceConfig.from_json(cfg.to_json()) == cfg


def test_custom_log_level_number_survives_json() -> None:
    cfg = FaultToleranceConfig(log_level=15)
    assert json.loads(cfg.to_json())["log_level"] == 15
    assert FaultToleranceConfig.from_json(cfg.to_json()).log_level == 15


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not json", "is not valid JSON"),
        ("[1, 2]", "must be an object, got list"),
        ('{"safety_factr": 2}', "did you mean 'safety_factor'?"),
        ('{"workload_check_interval": -1}', "workload_check_interval"),
    ],
)
def test_from_json_errors(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        FaultToleranceConfig.from_json(text)


def test_json_crosses_a_process_boundary() -> None:
    cfg = _custom_config()
    code = (
        "import sys; from resiliency.ft import FaultToleranceConfig as C; "
        "sys.stdout.write(C.from_json(sys.argv[1]).to_json())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, cfg.to_json()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert FaultToleranceConfig.from_json(done.stdout) == cfg


# -- generated reference --------------------------------------------------------------------------


def test_configuration_reference_is_up_to_date() -> None:
    doc = REPO_ROOT / "docs" / "configuration.md"
    assert doc.read_text(encoding="utf-8") == render_config_reference(), (
        "docs/configuration.md is stale; regenerate it with "
        "`python -m resiliency.ft._config_reference docs/configuration.md`"
    )


def test_configuration_reference_lists_every_field_and_a_valid_example() -> None:
    text = render_config_reference()
    for name, field in FaultToleranceConfig.model_fields.items():
        assert f"| `{name}` |" in text
        assert field.description, f"{name} has no description"
    example = re.search(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert example is not None
    cfg = FaultToleranceConfig.from_dict(yaml.safe_load(example.group(1))["fault_tolerance"])
    assert cfg.rank_section_timeouts == {"step": 30.0, "checkpoint": None}


def test_explicit_sigusr2_termination_moves_the_default_stack_dump_signal(caplog) -> None:
    with caplog.at_level("INFO", logger="resiliency.ft.config"):
        cfg = FaultToleranceConfig(rank_termination_signal="SIGUSR2")
    assert cfg.rank_termination_signal == signal.SIGUSR2
    assert cfg.stack_dump_signal == signal.SIGUSR1
    assert "the stack dump uses SIGUSR1 instead" in caplog.text
    # The moved value survives the trip to the monitor process.
    assert FaultToleranceConfig.from_json(cfg.to_json()) == cfg


def test_two_explicit_conflicting_signals_are_still_an_error() -> None:
    with pytest.raises(ConfigError, match="both SIGUSR2"):
        FaultToleranceConfig(rank_termination_signal="SIGUSR2", stack_dump_signal="SIGUSR2")


def test_empty_yaml_file_with_flags_uses_the_flags(tmp_path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    parser = argparse.ArgumentParser()
    add_ft_arguments(parser)
    args = parser.parse_args(["--ft-cfg-path", str(empty), "--ft-rank-heartbeat-timeout", "60"])
    assert config_from_args(args).rank_heartbeat_timeout == 60.0
    # No flag at all: still an error, as is a missing file or a file without the section.
    with pytest.raises(ConfigNotFoundError, match="is empty"):
        config_from_args(parser.parse_args(["--ft-cfg-path", str(empty)]))
    with pytest.raises(ConfigNotFoundError, match="does not exist"):
        config_from_args(
            parser.parse_args(
                ["--ft-cfg-path", str(tmp_path / "nope.yaml"), "--ft-safety-factor", "2"]
            )
        )
    other = tmp_path / "other.yaml"
    other.write_text("trainer: {max_steps: 3}\n")
    with pytest.raises(ConfigNotFoundError, match="has no 'fault_tolerance' section"):
        config_from_args(
            parser.parse_args(["--ft-cfg-path", str(other), "--ft-safety-factor", "2"])
        )
