"""resiliency.ft: see packages/ft-core/README.md."""

from resiliency.ft._nvrx_keys import NVRX_ONLY_KEYS
from resiliency.ft.cli_args import add_ft_arguments, config_from_args
from resiliency.ft.client import IPC_SOCKET_ENV, RankMonitorClient
from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.control import MonitorEvent, MonitorProcess
from resiliency.ft.errors import (
    ConfigError,
    ConfigNotFoundError,
    FaultToleranceError,
    MonitorRefusedError,
    MonitorUnavailableError,
    ProtocolError,
    ProtocolVersionError,
    RankMonitorClientError,
    StateDictError,
)
from resiliency.ft.fault_hook import (
    FAULT_HOOK_ENV,
    FAULT_HOOK_SIGNALS,
    SimulatedCrash,
    install_fault_hook,
)
from resiliency.ft.gpu_probe import CRITICAL_XIDS, GpuHealth, GpuProbe, XidEvent
from resiliency.ft.protocol import MAX_FRAME_BYTES, PROTOCOL_VERSION
from resiliency.ft.socket_dir import (
    TERMINATION_MARK_NAME,
    create_socket_dir,
    socket_path_for,
    stack_dump_path_for,
    termination_mark_path_for,
)
from resiliency.ft.state import (
    merge_loaded_timeouts,
    timeouts_from_state_dict,
    timeouts_to_state_dict,
)
from resiliency.ft.termination_mark import TerminationMark
from resiliency.ft.timeouts import (
    HeartbeatTimeouts,
    ObservedIntervals,
    SectionTimeouts,
    calculate_heartbeat_timeouts,
    calculate_section_timeouts,
)
from resiliency.ft.workload import WorkloadAction, WorkloadControlRequest

__all__ = [
    "CRITICAL_XIDS",
    "FAULT_HOOK_ENV",
    "FAULT_HOOK_SIGNALS",
    "IPC_SOCKET_ENV",
    "MAX_FRAME_BYTES",
    "NVRX_ONLY_KEYS",
    "PROTOCOL_VERSION",
    "TERMINATION_MARK_NAME",
    "ConfigError",
    "ConfigNotFoundError",
    "FaultToleranceConfig",
    "FaultToleranceError",
    "GpuHealth",
    "GpuProbe",
    "HeartbeatTimeouts",
    "MonitorEvent",
    "MonitorProcess",
    "MonitorRefusedError",
    "MonitorUnavailableError",
    "ObservedIntervals",
    "ProtocolError",
    "ProtocolVersionError",
    "RankMonitorClient",
    "RankMonitorClientError",
    "RankMonitorServer",
    "SectionTimeouts",
    "SimulatedCrash",
    "StateDictError",
    "TerminationMark",
    "WorkloadAction",
    "WorkloadControlRequest",
    "XidEvent",
    "add_ft_arguments",
    "calculate_heartbeat_timeouts",
    "calculate_section_timeouts",
    "config_from_args",
    "create_socket_dir",
    "install_fault_hook",
    "merge_loaded_timeouts",
    "socket_path_for",
    "stack_dump_path_for",
    "termination_mark_path_for",
    "timeouts_from_state_dict",
    "timeouts_to_state_dict",
]


def __getattr__(name: str) -> object:
    # Imported on demand: `python -m resiliency.ft.server` must not find the module pre-imported.
    if name == "RankMonitorServer":
        from resiliency.ft.server import RankMonitorServer  # noqa: PLC0415

        return RankMonitorServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
