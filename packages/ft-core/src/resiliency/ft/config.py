"""FaultToleranceConfig: every setting of the rank monitor, validated by pydantic.

A configuration comes from keyword arguments, from the ``fault_tolerance`` section of a YAML file
(at the top level or nested at any depth), or from command-line flags (see
:mod:`resiliency.ft.cli_args`); flags override the file, the file overrides the defaults.
Every way of building it raises :class:`~resiliency.ft.errors.ConfigError` on an invalid value or
an unknown key, and the message names the closest valid key.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from resiliency.ft._config_errors import (
    InvalidConfigError,
    format_validation_error,
    unknown_keys_message,
)
from resiliency.ft._config_values import (
    UNCATCHABLE_SIGNALS,
    LogLevel,
    NonNegativeInt,
    NonNegativeSeconds,
    Seconds,
    Signal,
    check_safety_factor,
)
from resiliency.ft._flags import config_from_namespace
from resiliency.ft._nvrx_keys import NVRX_ONLY_KEYS, drop_nvrx_only_keys
from resiliency.ft._yaml_section import SECTION_KEY, load_section
from resiliency.ft.errors import ConfigError

if TYPE_CHECKING:
    import argparse

__all__ = ["SECTION_KEY", "FaultToleranceConfig"]

logger = logging.getLogger(__name__)

# Stack-dump signals, in order of preference, when the default collides with the termination one.
_DUMP_SIGNALS = (signal.SIGUSR2, signal.SIGUSR1)


class FaultToleranceConfig(BaseModel):
    """Settings of the rank monitor and of the client in the rank.

    Times are in seconds. ``None`` for a timeout means "no timeout". Assigning an attribute
    validates the new value.

    Args:
        **data: any field below by name; unknown names are an error.

    Raises:
        ConfigError: a value is out of range or of the wrong type, or a key is unknown (the
            message names the closest valid key).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    workload_check_interval: Seconds = Field(
        5.0,
        description="Longest time between two checks of the rank's timers by the monitor; "
        "the monitor also wakes up at the nearest deadline.",
    )
    initial_rank_heartbeat_timeout: Seconds | None = Field(
        3600.0,
        description="Longest time from the rank's init_workload_monitoring() (its connection "
        "to the monitor) to its first heartbeat or section start, as in NVIDIA's resiliency "
        "extension. Time before the connection is covered by rank_startup_timeout. "
        "null: no timeout.",
    )
    rank_startup_timeout: Seconds | None = Field(
        3600.0,
        description="Longest time from the worker's spawn to its init_workload_monitoring(); "
        "catches a rank that hangs in imports or setup before it ever connects. Generous on "
        "purpose: a slow import must never look like a hang. ft-launcher enforces it once the "
        "job connected on the node (a peer rank, or an earlier attempt), so a script that "
        "never connects runs unwatched, as under torchrun. null: no timeout.",
    )
    rank_heartbeat_timeout: Seconds | None = Field(
        2700.0,
        description="Longest gap between two heartbeats once the first one came. null: no timeout.",
    )
    rank_section_timeouts: dict[str, Seconds | None] = Field(
        default_factory=dict,
        description="Longest time each named section may stay open, by section name. "
        "A section that is absent or null has no timeout. "
        "Flag syntax: `step:30,checkpoint:null`.",
        json_schema_extra={"doc_type": "mapping: section name to float > 0 or null"},
    )
    rank_out_of_section_timeout: Seconds | None = Field(
        None,
        description="Longest time with no section open, once the rank has used sections. "
        "null: no timeout.",
    )
    node_health_check_interval: Seconds = Field(
        5.0,
        description="How often the launcher checks the health of its node.",
    )
    safety_factor: Annotated[float, BeforeValidator(check_safety_factor)] = Field(
        5.0,
        ge=1.0,
        allow_inf_nan=False,
        description="Calculated timeout = longest observed interval x safety_factor.",
    )
    calculated_timeout_floor: NonNegativeSeconds = Field(
        60.0,
        description="No calculated timeout is below this, whether calculated in this job or "
        "loaded from a state saved by an earlier one: a short run observes none of the rare "
        "pauses (checkpoint, evaluation, garbage collection) a long one has. 0: no floor.",
    )
    rank_termination_signal: Signal = Field(
        signal.SIGTERM,
        description="Signal sent to a hung rank (after the stack dump); SIGKILL follows "
        "after termination_grace_period.",
    )
    log_level: LogLevel = Field(
        logging.INFO,
        description="Log level of the rank monitor process.",
    )
    enable_stack_dump: bool = Field(
        True,
        description="Ask a hung rank to dump the Python stacks of all its threads before it "
        "is terminated.",
    )
    stack_dump_signal: Signal = Field(
        signal.SIGUSR2,
        description="Signal on which the rank's client registers the stack dump (faulthandler).",
    )
    stack_dump_timeout: Seconds = Field(
        2.0,
        description="How long the monitor waits for the stack dump before it sends "
        "rank_termination_signal.",
    )
    termination_grace_period: NonNegativeSeconds = Field(
        5.0,
        description="Time between rank_termination_signal and SIGKILL.",
    )
    max_no_progress_cycles: NonNegativeInt = Field(
        3,
        description="ft-launcher stops the job (exit 6) once this many consecutive failed "
        "cycles have the same diagnosis: class, culprit ranks and cause (exception type and "
        "message, hung frame, or signal). NVIDIA's name. 0: never.",
    )
    restart_storm_restarts: NonNegativeInt = Field(
        0,
        description="ft-launcher stops the job (exit 6) when a failure would make more than "
        "this many restarts within restart_storm_window (e.g. 10). 0 (the default): never; "
        "--max-restarts is then the only bound on failures whose causes differ.",
    )
    restart_storm_window: Seconds = Field(
        600.0,
        description="The window of restart_storm_restarts, in seconds.",
    )

    def __init__(self, **data: Any) -> None:
        # pydantic routes model_validate() through a custom __init__ too, so every way of
        # building the model except model_construct() ends here.
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidConfigError(exc) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self).model_fields and not name.startswith("_"):
            raise ConfigError(_unknown_keys_message([name]))
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc)) from None

    @model_validator(mode="before")
    @classmethod
    def _check_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            data = drop_nvrx_only_keys(data)
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                raise ValueError(_unknown_keys_message(unknown))
        return data

    @model_validator(mode="after")
    def _check_signals(self) -> FaultToleranceConfig:
        if self.stack_dump_signal in UNCATCHABLE_SIGNALS:
            raise ValueError(
                f"stack_dump_signal cannot be {self.stack_dump_signal.name}: it cannot be caught; "
                "use e.g. SIGUSR2"
            )
        if self.enable_stack_dump and self.stack_dump_signal == self.rank_termination_signal:
            if "stack_dump_signal" not in self.model_fields_set:
                # Only the default collides with an explicit choice: the default gives way.
                free = next(s for s in _DUMP_SIGNALS if s != self.rank_termination_signal)
                logger.info(
                    "rank_termination_signal is %s, the default stack_dump_signal; the stack "
                    "dump uses %s instead",
                    self.rank_termination_signal.name,
                    free.name,
                )
                self.__dict__["stack_dump_signal"] = free
                return self
            raise ValueError(
                f"stack_dump_signal and rank_termination_signal are both "
                f"{self.stack_dump_signal.name}: the termination signal would only dump stacks; "
                "pick different signals"
            )
        return self

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, source: str | None = None
    ) -> FaultToleranceConfig:
        """Build a configuration from a mapping of field names to values.

        Args:
            data: field names to values (e.g. a parsed ``fault_tolerance`` section).
            source: where the mapping came from, named in error messages (e.g. a file path).

        Returns:
            The validated configuration.

        Raises:
            ConfigError: ``data`` is not a mapping, or it is invalid.
        """
        where = f" in {source}" if source else ""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"the {SECTION_KEY} section{where} must be a mapping of settings, "
                f"got {type(data).__name__}"
            )
        bad_keys = [key for key in data if not isinstance(key, str)]
        if bad_keys:
            raise ConfigError(f"setting names{where} must be strings, got {bad_keys!r}")
        try:
            return cls(**data)
        except InvalidConfigError as exc:
            message = format_validation_error(exc.validation_error)
            raise ConfigError(f"{source}: {message}" if source else message) from None

    @classmethod
    def from_kwargs(
        cls, ignore_not_recognized: bool = False, **kwargs: Any
    ) -> FaultToleranceConfig:
        """Build a configuration from keyword arguments, as NVIDIA's resiliency extension does.

        Unlike that tool, whose default drops unknown names silently, an unknown name is an
        error unless ``ignore_not_recognized=True`` is passed; then each unknown name is dropped
        with a warning that names the closest valid key. Its settings this toolkit lacks
        (``restart_check_interval``, ...) are always accepted with a warning.

        Args:
            ignore_not_recognized: drop unknown names (with a warning) instead of failing.
            **kwargs: settings by name.

        Returns:
            The validated configuration.

        Raises:
            ConfigError: a value is invalid, or a name is unknown and not ignored. It is a
                ``ValueError``, as the other tool raises.
        """
        if ignore_not_recognized:
            kwargs = _drop_unknown(kwargs, "from_kwargs")
        return cls.from_dict(kwargs)

    @classmethod
    def from_yaml_file(
        cls, path: str | os.PathLike[str], ignore_not_recognized: bool = False
    ) -> FaultToleranceConfig:
        """Load the ``fault_tolerance`` section of a YAML file.

        The section may sit at the top level or nested at any depth (inside mappings or lists).
        The file must contain exactly one such section: a file without it is an error, never a
        silent fallback to the defaults. A section that is empty (``fault_tolerance:``) means
        "all defaults".

        Args:
            path: the YAML file.
            ignore_not_recognized: drop unknown keys with a warning each (naming the closest
                valid key) instead of failing. NVIDIA's resiliency extension defaults to True
                and drops them silently; here the default is False.

        Returns:
            The validated configuration.

        Raises:
            ConfigError: the file is missing or unreadable, is not valid YAML, has no (or more
                than one) ``fault_tolerance`` section, or the section is invalid.
        """
        section = load_section(path, cls.model_fields)
        if ignore_not_recognized and isinstance(section, Mapping):
            section = _drop_unknown(section, str(path))
        return cls.from_dict(section, source=str(path))

    @classmethod
    def from_json(cls, text: str | bytes) -> FaultToleranceConfig:
        """Rebuild a configuration from :meth:`to_json` output (how the monitor process gets it).

        Args:
            text: a JSON object of settings.

        Returns:
            The validated configuration.

        Raises:
            ConfigError: the text is not a JSON object of valid settings.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"the fault-tolerance config is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"the fault-tolerance config JSON must be an object, got {type(data).__name__}"
            )
        return cls.from_dict(data)

    @classmethod
    def from_args(cls, namespace: argparse.Namespace) -> FaultToleranceConfig:
        """Build the configuration from flags parsed by a parser extended with ``add_ft_arguments``.

        Args:
            namespace: the parsed arguments.

        Returns:
            Defaults, overridden by the config file (if one was given), overridden by flags.

        Raises:
            ConfigError: see :func:`resiliency.ft.cli_args.config_from_args`.
        """
        return config_from_namespace(cls, namespace)

    # -- output -------------------------------------------------------------------------------

    def to_json(self) -> str:
        """Serialize to a JSON object; signals and log levels are written by name.

        Only the keys that were set explicitly (flags, file, keyword arguments) are written:
        the defaults fill in on reading, and :attr:`model_fields_set` survives the trip to the
        monitor and back to the rank, which tells an explicit setting from a default.

        Returns:
            The JSON text, readable by :meth:`from_json`.
        """
        return self.model_dump_json(exclude_unset=True)

    def to_yaml_dict(self) -> dict[str, Any]:
        """Return ``{"fault_tolerance": {...}}`` with plain YAML/JSON values (names for signals).

        Returns:
            A mapping ready for ``yaml.safe_dump``.
        """
        return {SECTION_KEY: self.model_dump(mode="json")}

    def to_yaml_file(self, path: str | os.PathLike[str]) -> None:
        """Write the configuration as a YAML file with a top-level ``fault_tolerance`` section.

        Args:
            path: the file to write (replaced if it exists).

        Raises:
            ConfigError: the file cannot be written.
        """
        text = yaml.safe_dump(self.to_yaml_dict(), sort_keys=False)
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write the fault-tolerance config to {path}: {exc}") from exc


def _drop_unknown(data: Mapping[Any, Any], source: str) -> dict[Any, Any]:
    valid = FaultToleranceConfig.model_fields
    kept = {}
    for key, value in data.items():
        if key in valid or key in NVRX_ONLY_KEYS:
            kept[key] = value
        else:
            logger.warning(
                "%s: %s; ignored (ignore_not_recognized=True)",
                source,
                _unknown_keys_message([key]),
            )
    return kept


def _unknown_keys_message(keys: list[Any]) -> str:
    return unknown_keys_message(keys, list(FaultToleranceConfig.model_fields))
