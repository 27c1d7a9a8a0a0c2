"""resiliency.ft: see packages/ft-core/README.md."""

from resiliency.ft.cli_args import add_ft_arguments, config_from_args
from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.errors import (
    ConfigError,
    ConfigNotFoundError,
    FaultToleranceError,
    MonitorUnavailableError,
    ProtocolError,
    ProtocolVersionError,
)

__all__ = [
    "ConfigError",
    "ConfigNotFoundError",
    "FaultToleranceConfig",
    "FaultToleranceError",
    "MonitorUnavailableError",
    "ProtocolError",
    "ProtocolVersionError",
    "add_ft_arguments",
    "config_from_args",
]
