"""The fault-tolerance flags' spellings, and reading them out of a parsed namespace.

This module knows how a config field is spelled on the command line and how a flag's string
becomes a model value; it builds the configuration through the model class it is given, so it
never imports :mod:`resiliency.ft.config`. :mod:`resiliency.ft.cli_args` adds the flags to a
parser; :meth:`FaultToleranceConfig.from_args <resiliency.ft.config.FaultToleranceConfig.from_args>`
reads them back through :func:`config_from_namespace`.
"""

from __future__ import annotations

import argparse
import logging
import typing
from typing import TYPE_CHECKING, Any

from resiliency.ft._config_errors import InvalidConfigError, format_validation_error
from resiliency.ft._config_values import is_optional
from resiliency.ft._nvrx_keys import NVRX_ONLY_KEYS
from resiliency.ft._yaml_section import SECTION_KEY, EmptyConfigFileError, load_section
from resiliency.ft.errors import ConfigError, ConfigNotFoundError

if TYPE_CHECKING:
    from resiliency.ft.config import FaultToleranceConfig

logger = logging.getLogger(__name__)

CFG_PATH_FLAGS = ("--fault-tol-cfg-path", "--ft-cfg-path")
CFG_PATH_DEST = "ft_cfg_path"
IGNORE_MISSING_CFG_FLAG = "--ignore-missing-fault-tol-cfg"
IGNORE_MISSING_CFG_DEST = "ft_ignore_missing_cfg"
_NULL_WORDS = frozenset({"null", "none"})


def field_flags(name: str) -> tuple[str, str]:
    """Return the two flags of a config field: ``--ft-param-<snake>`` and ``--ft-<kebab>``.

    Args:
        name: the field's name, e.g. ``rank_heartbeat_timeout``.

    Returns:
        The snake spelling, then the kebab spelling.
    """
    return f"--ft-param-{name}", f"--ft-{name.replace('_', '-')}"


def dest(name: str) -> str:
    """Return the namespace attribute that holds the flag of config field ``name``."""
    return f"ft_param_{name}"


def flags_label(name: str) -> str:
    """Return both spellings of a field's flag, as error messages name it."""
    snake, kebab = field_flags(name)
    return f"{kebab}/{snake}"


def is_mapping(annotation: Any) -> bool:
    """Tell whether a field's annotation is a mapping (given as ``name:value,...`` on the line)."""
    return typing.get_origin(annotation) is dict


def _parse_section_timeouts(raw: str) -> dict[str, str | None]:
    label = flags_label("rank_section_timeouts")
    result: dict[str, str | None] = {}
    for part in raw.split(","):
        item = part.strip()
        if not item:
            continue
        name, sep, value = item.rpartition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ConfigError(
                f"{label}: malformed item {item!r} in {raw!r}; expected NAME:SECONDS or "
                "NAME:null, separated by commas (e.g. 'step:30,checkpoint:null')"
            )
        if name in result:
            raise ConfigError(f"{label}: section {name!r} is given twice in {raw!r}")
        # The model converts and range-checks the number; an error then names this flag.
        result[name] = None if value.lower() in _NULL_WORDS else value
    return result


def _flag_value(model: type[FaultToleranceConfig], name: str, raw: Any) -> Any:
    if not isinstance(raw, str) or name in NVRX_ONLY_KEYS:
        return raw  # programmatic values go to the model as they are; NVRx-only ones are dropped
    annotation = model.model_fields[name].annotation
    if is_mapping(annotation):
        return _parse_section_timeouts(raw)
    if is_optional(annotation) and raw.strip().lower() in _NULL_WORDS:
        return None
    return raw.strip()


def _flag_values(
    model: type[FaultToleranceConfig], namespace: argparse.Namespace
) -> dict[str, Any]:
    values = {}
    for name in [*model.model_fields, *NVRX_ONLY_KEYS]:
        if hasattr(namespace, dest(name)):
            values[name] = _flag_value(model, name, getattr(namespace, dest(name)))
    return values


def config_from_namespace(
    model: type[FaultToleranceConfig], namespace: argparse.Namespace
) -> FaultToleranceConfig:
    """Build ``model`` from the fault-tolerance flags in ``namespace``.

    Precedence: flags override the config file, which overrides the defaults. For
    ``rank_section_timeouts`` the flag's sections are merged into the file's, section by
    section (``name:null`` removes a file's timeout for that section).

    Args:
        model: the configuration class to build (``FaultToleranceConfig``).
        namespace: the parsed arguments.

    Returns:
        The validated configuration.

    Raises:
        ConfigNotFoundError: the config file or its section is missing and
            ``--ignore-missing-fault-tol-cfg`` was not given.
        ConfigError: the file or a flag holds an invalid value (the message names the file or
            the flag).
    """
    path = getattr(namespace, CFG_PATH_DEST, None)
    ignore_missing = bool(getattr(namespace, IGNORE_MISSING_CFG_DEST, False))
    base: dict[str, Any] = {}
    flags = _flag_values(model, namespace)
    if path:
        try:
            section = load_section(path, model.model_fields)
        except EmptyConfigFileError as exc:
            # As in NVIDIA's resiliency extension: an empty file plus flags means "flags and
            # defaults"; an empty file and no flag at all is still an error.
            if not flags and not ignore_missing:
                raise ConfigNotFoundError(
                    f"{exc}, and no fault-tolerance flag was given; add a '{SECTION_KEY}:' "
                    f"section, give --ft-* flags, or pass {IGNORE_MISSING_CFG_FLAG}"
                ) from None
            logger.info("%s; using the defaults and the --ft-* flags", exc)
        except ConfigNotFoundError as exc:
            if not ignore_missing:
                raise
            logger.warning(
                "%s; using the defaults and flags instead (%s)", exc, IGNORE_MISSING_CFG_FLAG
            )
        else:
            # Validated on its own first, so that an error in the file names the file.
            file_cfg = model.from_dict(section, source=str(path))
            base = file_cfg.model_dump(exclude_unset=True)
            logger.debug("fault-tolerance config from %s: %s", path, base)

    merged = dict(base)
    for name, value in flags.items():
        if isinstance(value, dict) and isinstance(merged.get(name), dict):
            merged[name] = {**merged[name], **value}
        else:
            merged[name] = value
    try:
        return model(**merged)
    except InvalidConfigError as exc:
        raise ConfigError(
            format_validation_error(
                exc.validation_error, lambda name: flags_label(name) if name in flags else name
            )
        ) from None
