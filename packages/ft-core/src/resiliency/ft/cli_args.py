"""Command-line flags for FaultToleranceConfig, generated from the model's fields.

Every field ``some_name`` gets two spellings with one destination: ``--ft-param-some_name`` and
``--ft-some-name``. A flag that is not given leaves no attribute in the namespace
(``argparse.SUPPRESS``), so :func:`config_from_args` can tell "not given" from "given the
default". Values are strings; they are converted and validated by the model, so a flag accepts
exactly what the YAML file accepts, plus ``null``/``none`` for an optional value and
``name:secs,name2:null`` for ``rank_section_timeouts``.

The flags begin with ``--ft`` or ``--fault-tol`` and no ``torchrun`` flag does, so adding them to
``torch.distributed.run``'s parser changes none of its abbreviations (it allows them).
"""

from __future__ import annotations

import argparse
import functools
import typing

from resiliency.ft._config_errors import closest_key
from resiliency.ft._config_values import is_optional
from resiliency.ft._flags import (
    CFG_PATH_DEST,
    CFG_PATH_FLAGS,
    IGNORE_MISSING_CFG_DEST,
    IGNORE_MISSING_CFG_FLAG,
    dest,
    field_flags,
    is_mapping,
)
from resiliency.ft._nvrx_keys import NVRX_ONLY_KEYS
from resiliency.ft.config import FaultToleranceConfig

__all__ = [
    "CFG_PATH_DEST",
    "GROUP_TITLE",
    "IGNORE_MISSING_CFG_DEST",
    "add_ft_arguments",
    "config_from_args",
    "field_flags",
]

GROUP_TITLE = "fault tolerance"
_HINT_INSTALLED = "_ft_typo_hint_installed"


def _metavar(name: str) -> str:
    field = FaultToleranceConfig.model_fields[name]
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("metavar"), str):
        return str(extra["metavar"])
    annotation = field.annotation
    if is_mapping(annotation):
        return "NAME:SECS,..."
    if annotation is bool:
        return "BOOL"
    if is_optional(annotation):
        return "FLOAT|null"
    return "FLOAT" if annotation is float else "VALUE"


def _default_text(name: str) -> str:
    value = FaultToleranceConfig().model_dump(mode="json")[name]
    if value is None:
        return "null"
    if isinstance(value, dict):
        return ",".join(f"{k}:{'null' if v is None else v}" for k, v in value.items()) or "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def add_ft_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add every fault-tolerance flag to ``parser``, in one group titled "fault tolerance".

    Adds both spellings of each config field, ``--fault-tol-cfg-path``/``--ft-cfg-path`` (dest
    ``ft_cfg_path``) and ``--ignore-missing-fault-tol-cfg`` (dest ``ft_ignore_missing_cfg``).
    It also makes an unknown flag that starts with ``--ft`` or ``--fault`` an argparse error that
    names the closest valid flag (instead of argparse's bare "unrecognized arguments", or worse,
    the flag's value being taken as torchrun's training script).

    Args:
        parser: the parser to extend, e.g. ``torch.distributed.run.get_args_parser()``.

    Returns:
        The argument group holding the flags.

    Raises:
        argparse.ArgumentError: a flag is already defined on ``parser`` (e.g. added twice).
    """
    group = parser.add_argument_group(
        GROUP_TITLE,
        "Settings of the rank monitor. Each flag overrides the same key of the config file's "
        "'fault_tolerance' section; the file overrides the defaults. Optional timeouts accept "
        "'null' for no timeout.",
    )
    group.add_argument(
        *CFG_PATH_FLAGS,
        dest=CFG_PATH_DEST,
        default=None,
        metavar="PATH",
        help="YAML file with a 'fault_tolerance' section, at the top level or nested at any depth.",
    )
    group.add_argument(
        IGNORE_MISSING_CFG_FLAG,
        dest=IGNORE_MISSING_CFG_DEST,
        action="store_true",
        help="If the config file or its 'fault_tolerance' section is missing, log a warning and "
        "use the defaults and flags instead of failing.",
    )
    for name, field in FaultToleranceConfig.model_fields.items():
        description = (field.description or "").replace("%", "%%")
        group.add_argument(
            *field_flags(name),
            dest=dest(name),
            default=argparse.SUPPRESS,
            metavar=_metavar(name),
            help=f"{description} (default: {_default_text(name)})",
        )
    for name, reason in NVRX_ONLY_KEYS.items():
        group.add_argument(
            *field_flags(name),
            dest=dest(name),
            default=argparse.SUPPRESS,
            metavar="VALUE",
            help=f"Accepted for NVIDIA's resiliency extension; no effect here ({reason}).",
        )
    _install_typo_hint(parser)
    return group


def _all_ft_flags() -> list[str]:
    flags = [*CFG_PATH_FLAGS, IGNORE_MISSING_CFG_FLAG]
    for name in [*FaultToleranceConfig.model_fields, *NVRX_ONLY_KEYS]:
        flags.extend(field_flags(name))
    return flags


def _parser_ft_flags(parser: argparse.ArgumentParser) -> list[str]:
    # argparse has no public list of its option strings; every action carries its own.
    return [
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith(("--ft", "--fault"))
    ]


def _install_typo_hint(parser: argparse.ArgumentParser) -> None:
    # argparse has no hook for unknown options, so wrap this parser's parse_known_args (which
    # parse_args calls) and turn an unknown --ft*/--fault* flag into an error with a suggestion.
    if getattr(parser, _HINT_INSTALLED, False):
        return
    original = parser.parse_known_args
    # NVRx-only flags are accepted but do nothing: suggested only when no working flag is close.
    no_effect = {flag for name in NVRX_ONLY_KEYS for flag in field_flags(name)}

    @functools.wraps(original)
    def parse_known_args(
        args: typing.Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = original(args, namespace)
        for arg in extras:
            flag = arg.split("=", 1)[0]
            if flag.startswith(("--ft", "--fault")):
                # Every --ft/--fault flag of this parser, the launcher's own included.
                known = [*_all_ft_flags(), *_parser_ft_flags(parser)]
                working = list(dict.fromkeys(f for f in known if f not in no_effect))
                close = closest_key(flag, working, sorted(no_effect))
                hint = (
                    f"; did you mean {close}?"
                    if close
                    else f"; see the '{GROUP_TITLE}' options in --help"
                )
                if close in no_effect:
                    hint += " (a setting of NVIDIA's resiliency extension; no effect here)"
                parser.error(f"unknown fault-tolerance flag {flag}{hint}")
        return parsed, extras

    setattr(parser, "parse_known_args", parse_known_args)  # noqa: B010 (mypy: method assignment)
    setattr(parser, _HINT_INSTALLED, True)


def config_from_args(namespace: argparse.Namespace) -> FaultToleranceConfig:
    """Build the configuration from flags added by :func:`add_ft_arguments`.

    Precedence: flags override the config file, which overrides the defaults. For
    ``rank_section_timeouts`` the flag's sections are merged into the file's, section by
    section (``name:null`` removes a file's timeout for that section).

    Args:
        namespace: the parsed arguments.

    Returns:
        The validated configuration.

    Raises:
        ConfigNotFoundError: the config file or its section is missing and
            ``--ignore-missing-fault-tol-cfg`` was not given.
        ConfigError: the file or a flag holds an invalid value (the message names the file or
            the flag).
    """
    return FaultToleranceConfig.from_args(namespace)
