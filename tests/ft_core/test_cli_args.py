"""Command-line flags for FaultToleranceConfig: both spellings, precedence, errors, torchrun."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path

import pytest

from resiliency.ft import (
    NVRX_ONLY_KEYS,
    ConfigError,
    ConfigNotFoundError,
    FaultToleranceConfig,
    add_ft_arguments,
    config_from_args,
)
from resiliency.ft._config_errors import closest_key, edit_distance
from resiliency.ft.cli_args import GROUP_TITLE, field_flags

# One valid, non-default flag value per field, and what the config holds for it. A new field
# must be added here (test_every_field_has_a_sample_value enforces it).
SAMPLES: dict[str, tuple[str, object]] = {
    "workload_check_interval": ("0.5", 0.5),
    "initial_rank_heartbeat_timeout": ("null", None),
    "rank_startup_timeout": ("600", 600.0),
    "rank_heartbeat_timeout": ("90", 90.0),
    "rank_section_timeouts": ("step:30,ckpt:null", {"step": 30.0, "ckpt": None}),
    "rank_out_of_section_timeout": ("12.5", 12.5),
    "node_health_check_interval": ("1", 1.0),
    "safety_factor": ("2", 2.0),
    "calculated_timeout_floor": ("0", 0.0),
    "rank_termination_signal": ("SIGINT", signal.SIGINT),
    "log_level": ("debug", logging.DEBUG),
    "enable_stack_dump": ("false", False),
    "stack_dump_signal": ("USR1", signal.SIGUSR1),
    "stack_dump_timeout": ("0.1", 0.1),
    "termination_grace_period": ("0", 0.0),
    "max_no_progress_cycles": ("0", 0),
    "restart_storm_restarts": ("4", 4),
    "restart_storm_window": ("60", 60.0),
}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launcher")
    add_ft_arguments(parser)
    return parser


def parse(*argv: str) -> FaultToleranceConfig:
    return config_from_args(make_parser().parse_args(list(argv)))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_every_field_has_a_sample_value() -> None:
    assert set(SAMPLES) == set(FaultToleranceConfig.model_fields)


def test_no_flags_give_defaults_and_leave_no_attributes() -> None:
    namespace = make_parser().parse_args([])
    assert not any(key.startswith("ft_param_") for key in vars(namespace))
    assert namespace.ft_cfg_path is None
    assert namespace.ft_ignore_missing_cfg is False
    assert config_from_args(namespace) == FaultToleranceConfig()


@pytest.mark.parametrize("name", sorted(SAMPLES))
@pytest.mark.parametrize("spelling", ["snake", "kebab"])
def test_both_spellings_set_every_field(name: str, spelling: str) -> None:
    snake, kebab = field_flags(name)
    raw, expected = SAMPLES[name]
    flag = snake if spelling == "snake" else kebab
    cfg = parse(flag, raw)
    assert getattr(cfg, name) == expected
    # Only that field changed.
    others = {key: value for key, value in cfg if key != name}
    assert others == {key: value for key, value in FaultToleranceConfig() if key != name}


def test_spellings_share_one_destination_and_the_last_one_wins() -> None:
    cfg = parse("--ft-param-safety_factor", "2", "--ft-safety-factor", "3")
    assert cfg.safety_factor == 3.0
    cfg = parse("--ft-safety-factor=3", "--ft-param-safety_factor=4")
    assert cfg.safety_factor == 4.0


def test_flags_are_generated_from_the_model_in_one_group() -> None:
    parser = argparse.ArgumentParser()
    group = add_ft_arguments(parser)
    assert group.title == GROUP_TITLE
    group_flags = {flag for action in group._group_actions for flag in action.option_strings}
    expected = {"--fault-tol-cfg-path", "--ft-cfg-path", "--ignore-missing-fault-tol-cfg"}
    for name in [*FaultToleranceConfig.model_fields, *NVRX_ONLY_KEYS]:
        expected.update(field_flags(name))
    assert group_flags == expected
    assert [g.title for g in parser._action_groups].count(GROUP_TITLE) == 1
    help_text = parser.format_help()
    assert "--ft-rank-section-timeouts" in help_text
    assert "(default: SIGTERM)" in help_text


def test_adding_the_flags_twice_is_an_error() -> None:
    parser = make_parser()
    with pytest.raises(argparse.ArgumentError):
        add_ft_arguments(parser)


@pytest.mark.parametrize("word", ["true", "1", "yes", "True", "on"])
def test_boolean_true_spellings(word: str) -> None:
    assert parse(
        "--ft-enable-stack-dump", "false", "--ft-enable-stack-dump", word
    ).enable_stack_dump


@pytest.mark.parametrize("word", ["false", "0", "no", "NO", "off"])
def test_boolean_false_spellings(word: str) -> None:
    assert not parse("--ft-param-enable_stack_dump", word).enable_stack_dump


@pytest.mark.parametrize("word", ["null", "None", "NULL"])
def test_null_disables_an_optional_timeout(word: str) -> None:
    assert parse("--ft-rank-heartbeat-timeout", word).rank_heartbeat_timeout is None


# -- rank_section_timeouts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("step:30,ckpt:null", {"step": 30.0, "ckpt": None}),
        (" step : 30 , ckpt : None ,", {"step": 30.0, "ckpt": None}),
        ("a:b:1.5", {"a:b": 1.5}),
        ("", {}),
    ],
)
def test_section_timeouts_flag(raw: str, expected: dict[str, float | None]) -> None:
    assert parse("--ft-rank-section-timeouts", raw).rank_section_timeouts == expected


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("step", "malformed item 'step'"),
        (":30", "malformed item ':30'"),
        ("step:", "malformed item 'step:'"),
        ("step:30,ckpt", "malformed item 'ckpt'"),
        ("step:30,step:40", "section 'step' is given twice"),
        ("step:abc", "rank_section_timeouts['step']"),
        ("step:-1", "rank_section_timeouts['step']: Input should be greater than 0"),
        ("step:0", "Input should be greater than 0"),
    ],
)
def test_malformed_section_timeouts_flag_names_the_flag(raw: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse("--ft-param-rank_section_timeouts", raw)
    assert "--ft-rank-section-timeouts/--ft-param-rank_section_timeouts" in str(info.value)
    assert fragment in str(info.value)


# -- bad values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (
            ["--ft-safety-factor", "0.5"],
            "--ft-safety-factor/--ft-param-safety_factor: safety_factor must be >= 1",
        ),
        (["--ft-param-workload_check_interval", "-1"], "--ft-workload-check-interval/"),
        (["--ft-workload-check-interval", "0"], "greater than 0"),
        (["--ft-workload-check-interval", "null"], "--ft-workload-check-interval/"),
        (["--ft-rank-heartbeat-timeout", "ten"], "--ft-rank-heartbeat-timeout/"),
        (["--ft-termination-grace-period", "-2"], "--ft-termination-grace-period/"),
        (["--ft-rank-termination-signal", "SIGFOO"], "unknown signal 'SIGFOO'"),
        (["--ft-log-level", "loud"], "--ft-log-level/--ft-param-log_level: unknown log level"),
        (["--ft-enable-stack-dump", "maybe"], "--ft-enable-stack-dump/"),
    ],
)
def test_bad_flag_value_is_a_config_error_naming_the_flag(argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(*argv)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["--ft-rank-heartbeat-timout", "5"], "--ft-rank-heartbeat-timeout"),
        (["--ft-param-rank_heartbeat_timout=5"], "--ft-param-rank_heartbeat_timeout"),
        (["--ft-saftey-factor", "2"], "--ft-safety-factor"),
        (["--fault-tol-cfg-pth", "x.yaml"], "--fault-tol-cfg-path"),
    ],
)
def test_typo_in_flag_names_the_closest_flag(
    argv: list[str], suggestion: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        make_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"did you mean {suggestion}?" in err
    assert "unknown fault-tolerance flag" in err


def test_unknown_ft_flag_without_close_match(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        make_parser().parse_args(["--ft-zzzzzzzzzzzzzzzzzzzzzzzzzz", "1"])
    assert "see the 'fault tolerance' options in --help" in capsys.readouterr().err


def test_parse_known_args_still_returns_other_unknown_flags() -> None:
    namespace, extras = make_parser().parse_known_args(["--other", "--ft-safety-factor", "2"])
    assert extras == ["--other"]
    assert config_from_args(namespace).safety_factor == 2.0


# -- config file and precedence -------------------------------------------------------------------


@pytest.fixture
def cfg_file(tmp_path: Path) -> Path:
    return write(
        tmp_path / "train.yaml",
        "trainer:\n  max_steps: 10\n  fault_tolerance:\n"
        "    safety_factor: 3\n    rank_heartbeat_timeout: 100\n"
        "    rank_section_timeouts: {step: 10, ckpt: 50}\n",
    )


@pytest.mark.parametrize("path_flag", ["--fault-tol-cfg-path", "--ft-cfg-path"])
def test_file_overrides_defaults(cfg_file: Path, path_flag: str) -> None:
    cfg = parse(path_flag, str(cfg_file))
    assert cfg.safety_factor == 3.0
    assert cfg.rank_heartbeat_timeout == 100.0
    assert cfg.rank_section_timeouts == {"step": 10.0, "ckpt": 50.0}
    assert cfg.workload_check_interval == 5.0


def test_flags_override_file(cfg_file: Path) -> None:
    cfg = parse(
        "--ft-param-safety_factor",
        "4",
        "--ft-cfg-path",
        str(cfg_file),
        "--ft-rank-heartbeat-timeout",
        "null",
    )
    assert cfg.safety_factor == 4.0
    assert cfg.rank_heartbeat_timeout is None
    assert cfg.rank_section_timeouts == {"step": 10.0, "ckpt": 50.0}


def test_section_timeout_flags_merge_into_the_file(cfg_file: Path) -> None:
    cfg = parse(
        "--ft-cfg-path", str(cfg_file), "--ft-rank-section-timeouts", "step:5,ckpt:null,io:7"
    )
    assert cfg.rank_section_timeouts == {"step": 5.0, "ckpt": None, "io": 7.0}


def test_flag_error_with_a_file_names_the_flag(cfg_file: Path) -> None:
    with pytest.raises(ConfigError, match="--ft-safety-factor/--ft-param-safety_factor"):
        parse("--ft-cfg-path", str(cfg_file), "--ft-safety-factor", "0")


def test_file_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "fault_tolerance:\n  rank_heartbeat_timout: 3\n")
    with pytest.raises(ConfigError) as info:
        parse("--ft-cfg-path", str(path), "--ft-safety-factor", "2")
    assert str(path) in str(info.value)
    assert "did you mean 'rank_heartbeat_timeout'?" in str(info.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigNotFoundError, match="does not exist"):
        parse("--fault-tol-cfg-path", str(tmp_path / "missing.yaml"))


def test_file_without_section_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "plain.yaml", "model: {layers: 2}\n")
    with pytest.raises(ConfigNotFoundError, match="no 'fault_tolerance' section"):
        parse("--ft-cfg-path", str(path))


def test_ignore_missing_file_uses_defaults_and_flags(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "missing.yaml"
    with caplog.at_level(logging.WARNING, logger="resiliency.ft.cli_args"):
        cfg = parse(
            "--ft-cfg-path",
            str(missing),
            "--ignore-missing-fault-tol-cfg",
            "--ft-safety-factor",
            "2",
        )
    assert cfg.safety_factor == 2.0
    assert cfg.rank_heartbeat_timeout == 2700.0
    assert str(missing) in caplog.text
    assert "using the defaults and flags" in caplog.text


def test_ignore_missing_covers_a_file_without_section(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "plain.yaml", "model: {layers: 2}\n")
    with caplog.at_level(logging.WARNING, logger="resiliency.ft.cli_args"):
        cfg = parse("--ft-cfg-path", str(path), "--ignore-missing-fault-tol-cfg")
    assert cfg == FaultToleranceConfig()
    assert "no 'fault_tolerance' section" in caplog.text


def test_ignore_missing_does_not_hide_an_invalid_file(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "fault_tolerance:\n  safety_factor: -1\n")
    with pytest.raises(ConfigError, match="safety_factor"):
        parse("--ft-cfg-path", str(path), "--ignore-missing-fault-tol-cfg")


def test_from_args_classmethod(cfg_file: Path) -> None:
    namespace = make_parser().parse_args(
        ["--ft-cfg-path", str(cfg_file), "--ft-log-level", "ERROR"]
    )
    cfg = FaultToleranceConfig.from_args(namespace)
    assert cfg.log_level == logging.ERROR
    assert cfg.safety_factor == 3.0


# -- torchrun's real parser -----------------------------------------------------------------------


def torchrun_parser() -> argparse.ArgumentParser:
    run = pytest.importorskip("torch.distributed.run")
    parser: argparse.ArgumentParser = run.get_args_parser()
    return parser


def test_flags_work_on_torchrun_parser(tmp_path: Path) -> None:
    parser = torchrun_parser()
    add_ft_arguments(parser)
    cfg_path = write(tmp_path / "ft.yaml", "fault_tolerance: {rank_heartbeat_timeout: 60}\n")
    args = parser.parse_args(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            "--ft-cfg-path",
            str(cfg_path),
            "--ft-param-safety_factor",
            "2",
            "--ft-rank-section-timeouts",
            "step:30,ckpt:null",
            "--ft-workload-check-interval",
            "-1",
            "train.py",
            "--ft-safety-factor",
            "9",
            "--lr",
            "0.1",
        ]
    )
    assert args.nproc_per_node == "2"
    assert args.max_restarts == 3
    assert args.training_script == "train.py"
    # Flags after the script belong to the script, even when they look like ours.
    assert args.training_script_args == ["--ft-safety-factor", "9", "--lr", "0.1"]
    with pytest.raises(ConfigError, match="--ft-workload-check-interval/"):
        config_from_args(args)
    args.ft_param_workload_check_interval = "0.5"
    cfg = config_from_args(args)
    assert cfg.rank_heartbeat_timeout == 60.0
    assert cfg.safety_factor == 2.0
    assert cfg.rank_section_timeouts == {"step": 30.0, "ckpt": None}
    assert cfg.workload_check_interval == 0.5


def test_flags_do_not_change_torchrun_abbreviations() -> None:
    parser = torchrun_parser()
    assert parser.allow_abbrev  # the behaviour this test guards against
    torchrun_flags = {f for action in parser._actions for f in action.option_strings}
    group = add_ft_arguments(parser)
    ft_flags = {f for action in group._group_actions for f in action.option_strings}
    assert not ft_flags & torchrun_flags
    # An abbreviation of a torchrun flag keeps resolving to it iff no new flag shares the prefix.
    for flag in (f for f in torchrun_flags if f.startswith("--")):
        for end in range(3, len(flag)):
            prefix = flag[:end]
            clashes = [f for f in ft_flags if f.startswith(prefix)]
            assert not clashes, f"{prefix!r} (abbreviates {flag}) now also matches {clashes}"
    # (torchrun lists both --x-y and --x_y, so a prefix must reach past the first separator.)
    args = parser.parse_args(["--nproc-per", "4", "--max-re", "2", "--standa", "train.py"])
    assert (args.nproc_per_node, args.max_restarts, args.standalone) == ("4", 2, True)


def test_ft_abbreviations_on_torchrun_parser(capsys: pytest.CaptureFixture[str]) -> None:
    parser = torchrun_parser()
    add_ft_arguments(parser)
    args = parser.parse_args(["--ft-safety", "3", "--ft-param-stack_dump_t", "1", "train.py"])
    cfg = config_from_args(args)
    assert (cfg.safety_factor, cfg.stack_dump_timeout) == (3.0, 1.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["--ft-rank", "3", "train.py"])
    assert "ambiguous option: --ft-rank" in capsys.readouterr().err


def test_typo_on_torchrun_parser_fails_before_the_script_is_misread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = torchrun_parser()
    add_ft_arguments(parser)
    # Without the hint, argparse would take "30" as the training script.
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--ft-rank-heartbeat-timout", "30", "train.py"])
    assert info.value.code == 2
    assert "did you mean --ft-rank-heartbeat-timeout?" in capsys.readouterr().err


def test_closest_key_prefers_working_names_and_edit_distance() -> None:
    assert edit_distance("polcy", "policy") == 1
    assert edit_distance("polciy", "policy") == 1  # two neighbours swapped
    working = ["--ft-restart-policy", "--ft-workload-check-interval"]
    nvrx = ["--ft-restart-check-interval"]
    assert closest_key("--ft-restart-polcy", working, nvrx) == "--ft-restart-policy"
    # Only an NVRx key is close: it is named (the caller says it has no effect).
    assert closest_key("--ft-restart-check-intervl", working, nvrx) == nvrx[0]
    # A tie goes to the working name.
    assert closest_key("ab", ["ax"], ["ay"]) == "ax"
    assert closest_key("--ft-zzzzzzzzzzzz", working, nvrx) is None
