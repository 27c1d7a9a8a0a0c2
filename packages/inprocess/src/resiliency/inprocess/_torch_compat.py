"""What the wrapper does about torch.distributed's process-wide state between iterations.

Group names: torch names each new process group after a process-wide counter
(``_world.group_count``; the default group is "0"). ``destroy_process_group()`` resets it, but an
``init_process_group`` interrupted by a fault has already counted its group without registering it,
and no destroy follows. The ranks of the next iteration would then name their groups differently
(rank 0 "1", a rank that never reached ``init_process_group`` "0"), wait for each other under
different store keys and hang.
Checked with torch 2.13: a private detail, checked before use.

The excepthook: every ``init_process_group`` wraps ``sys.excepthook`` in one that prefixes each
line with ``[rank<N>]:``, its rank at that time, and never unwraps it. After three iterations an
uncaught exception's lines read ``[rank2]: [rank2]: [rank2]: ...``, and after a rank
reassignment they name old ranks too. Each iteration starts again from the hook the call began
with, so the lines carry one prefix, of the current rank.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from resiliency.inprocess.exception import ConfigError

log = logging.getLogger(__name__)


def require_no_process_group() -> None:
    """Refuse a call made with a process group already in place (as NVRx does).

    Raises:
        ConfigError: torch.distributed is initialized.
    """
    if dist.is_available() and dist.is_initialized():
        raise ConfigError(
            "torch.distributed is already initialized when the wrapped function is called "
            "(it needs `not torch.distributed.is_initialized()`, as NVRx's does): call "
            "init_process_group inside the wrapped function, so a restart can re-create it"
        )


def fresh_iteration(excepthook: Callable[..., Any]) -> None:
    """Before an iteration's call: torch's group naming from "0", ``sys.excepthook`` as the
    call found it (whatever the abort callback did, the groups must be named alike on every
    rank)."""
    reset_group_names()
    sys.excepthook = excepthook


def reset_group_names() -> None:
    """Restart torch's group naming at "0", when no process group exists."""
    if dist.is_initialized():
        return
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is None or not hasattr(type(world), "group_count"):
        log.warning(
            "torch %s has no distributed_c10d._world.group_count: cannot reset process-group "
            "names; an init_process_group interrupted by a fault may make the next one hang",
            torch.__version__,
        )
        return
    world.group_count = 0
