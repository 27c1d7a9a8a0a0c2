"""resiliency.inprocess: restart a distributed training function inside the same processes.

A drop-in for ``nvidia_resiliency_ext.inprocess`` (0.4 names and meanings) that also runs on
CPU with gloo. See docs/inprocess.md.
"""

from resiliency.inprocess import (
    abort,
    auto_restart,
    completion,
    exception,
    finalize,
    health_check,
    initialize,
    monitor_thread,
    nested_restarter,
    progress_watchdog,
    rank_assignment,
    rank_filter,
    state,
    store,
    terminate,
    tools,
)
from resiliency.inprocess.compose import Compose
from resiliency.inprocess.exception import (
    HealError,
    InternalError,
    RepeatedFaultError,
    RestartError,
    RollbackError,
)
from resiliency.inprocess.heal import Healer, HealResult
from resiliency.inprocess.rollback import Rollback, RollbackResult
from resiliency.inprocess.state import FrozenState, Mode, State
from resiliency.inprocess.wrap import CallWrapper, Wrapper

__all__ = [
    "CallWrapper",
    "Compose",
    "FrozenState",
    "HealError",
    "HealResult",
    "Healer",
    "InternalError",
    "Mode",
    "RepeatedFaultError",
    "RestartError",
    "Rollback",
    "RollbackError",
    "RollbackResult",
    "State",
    "Wrapper",
    "abort",
    "auto_restart",
    "completion",
    "exception",
    "finalize",
    "health_check",
    "initialize",
    "monitor_thread",
    "nested_restarter",
    "progress_watchdog",
    "rank_assignment",
    "rank_filter",
    "state",
    "store",
    "terminate",
    "tools",
]
